#!/usr/bin/env bash
# mypy over the public surface (the files listed in pyproject.toml), as the package installs: mypy cannot follow
# pyproject's package-dir mapping (trainers/ -> gradengines.trainers, ...), so it reads a view of the repository
# made of links in a temporary folder.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VIEW="$(mktemp -d)"
trap 'rm -rf "$VIEW"' EXIT
mkdir "$VIEW/gradengines"
for file in "$ROOT"/gradengines/*.py; do ln -s "$file" "$VIEW/gradengines/$(basename "$file")"; done
for folder in trainers models tasks; do ln -s "$ROOT/$folder" "$VIEW/gradengines/$folder"; done
# a cache of its own each run: links that changed between runs read stale entries from a shared one
cd "$VIEW" && "$ROOT/.venv/bin/mypy" --config-file "$ROOT/pyproject.toml" --cache-dir "$VIEW/.mypy_cache" "$@"
