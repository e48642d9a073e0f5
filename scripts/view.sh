#!/usr/bin/env bash
# Print a temporary folder holding the package as it installs, made of links: gradengines/ with the facade's
# modules and trainers/, models/, tasks/ inside it (pyproject's package-dir mapping, which mypy and mkdocstrings
# cannot follow). The caller removes it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VIEW="$(mktemp -d)"
mkdir "$VIEW/gradengines"
for file in "$ROOT"/gradengines/*.py; do ln -s "$file" "$VIEW/gradengines/$(basename "$file")"; done
for folder in trainers models tasks; do ln -s "$ROOT/$folder" "$VIEW/gradengines/$folder"; done
echo "$VIEW"
