#!/usr/bin/env bash
# Regenerates constraints.txt (sparktrain/constraints.txt; the top-level constraints.txt links
# to it) from requirements/constraints.in with uv's resolver. Pins already in the file are kept;
# ARGS go to uv, e.g. --upgrade-package torch, or --upgrade for everything.
# uv is taken from PATH, or installed into .venv-pin (pip install uv) the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=$(command -v uv || true)
if [ -z "$UV" ]; then
    [ -x .venv-pin/bin/uv ] || { python3 -m venv .venv-pin && .venv-pin/bin/pip install -q uv; }
    UV=.venv-pin/bin/uv
fi
# torch's CUDA libraries are pinned too: a CPU wheel installed first never asks for them, and a
# CUDA install of the same torch gets the versions it was built with.
exec "$UV" pip compile requirements/constraints.in -o sparktrain/constraints.txt \
    --no-annotate --no-emit-package sparktrain \
    --custom-compile-command scripts/pin-versions.sh "$@"
