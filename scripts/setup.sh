#!/usr/bin/env bash
# Create .venv (if missing) and install the pinned dependencies and this project.
# torch goes first and pinned: an unpinned torch can pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check "$(grep '^torch==' requirements.txt)"
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
