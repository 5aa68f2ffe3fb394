#!/usr/bin/env bash
# Build Horovod for this checkout's .venv (or the interpreter given as argument 1 / $PYTHON),
# with the checkout's constraints.txt. The recipe itself ships in the package:
# sparktrain/commands/install-horovod.sh (`sparktrain install-horovod` runs it from a wheel).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPARKTRAIN_REPO="$REPO" exec bash "$REPO/sparktrain/commands/install-horovod.sh" "$@"
