#!/usr/bin/env bash
# mypy over the public surface (the files listed in pyproject.toml), as the package installs: mypy cannot follow
# pyproject's package-dir mapping (trainers/ -> gradengines.trainers, ...), so it reads a view of links
# (scripts/view.sh), with a cache of its own each run (links that changed between runs read stale entries from a
# shared one).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VIEW="$(bash "$ROOT/scripts/view.sh")"
trap 'rm -rf "$VIEW"' EXIT
cd "$VIEW" && "$ROOT/.venv/bin/mypy" --config-file "$ROOT/pyproject.toml" --cache-dir "$VIEW/.mypy_cache" "$@"
