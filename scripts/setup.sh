#!/usr/bin/env bash
# Create .venv (if missing) and install the pinned dependencies and this project.
# torch goes first and pinned: an unpinned torch can pull a multi-GB CUDA build.
#
#   bash scripts/setup.sh        .venv: torch 2.13.0 (CPU), transformers; what CI runs
#   bash scripts/setup.sh timm   .venv-timm: torch 2.14.1 with torchvision 0.29.1 (the pair that imports
#                                together here; a ~5.5 GB CUDA build that runs on the CPU), timm, transformers
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
TORCH="$(grep '^torch==' requirements.txt)"
if [ "${1:-}" = "timm" ]; then
    VENV=.venv-timm
    TORCH="torch==2.14.1 torchvision==0.29.1"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# shellcheck disable=SC2086
"${PIP[@]}" $TORCH
grep -v '^torch==' requirements.txt > "$VENV/requirements-rest.txt"
"${PIP[@]}" -r "$VENV/requirements-rest.txt"
if [ "$VENV" = .venv-timm ]; then
    "${PIP[@]}" $TORCH "$(grep '^timm==' requirements-timm.txt)"
fi
"${PIP[@]}" --no-deps -e .
