#!/usr/bin/env bash
# The guide as a site (mkdocs.yml), its API reference read from the package as it installs (scripts/view.sh):
#   bash scripts/docs.sh              mkdocs build --strict (a broken link or reference fails), into site/
#   bash scripts/docs.sh serve        mkdocs serve
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VIEW="$(bash "$ROOT/scripts/view.sh")"
trap 'rm -rf "$VIEW"' EXIT
cd "$ROOT"
export GRADENGINES_API_VIEW="$VIEW" NO_MKDOCS_2_WARNING=1
if [ "${1:-build}" = "serve" ]; then
    "$ROOT/.venv/bin/mkdocs" serve
else
    "$ROOT/.venv/bin/mkdocs" build --strict
fi
