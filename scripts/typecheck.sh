#!/usr/bin/env bash
# mypy over the public surface (the files listed in pyproject.toml), as the package installs: mypy cannot follow
# pyproject's package-dir mapping (trainers/ -> gradengines.trainers, ...), so it reads a view of the repository
# made of links in a temporary folder.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VIEW="$(mktemp -d)"
trap 'rm -rf "$VIEW"' EXIT
mkdir "$VIEW/gradengines"
ln -s "$ROOT/gradengines/__init__.py" "$VIEW/gradengines/__init__.py"
for folder in trainers models tasks; do ln -s "$ROOT/$folder" "$VIEW/gradengines/$folder"; done
cd "$VIEW" && "$ROOT/.venv/bin/mypy" --config-file "$ROOT/pyproject.toml" --cache-dir "$ROOT/.mypy_cache" "$@"
