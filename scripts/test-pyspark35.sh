#!/usr/bin/env bash
# The classic Spark tier's runner tests against the newest pyspark 3.5, the lowest pyspark that
# pyproject.toml claims, in a virtual environment of its own (.venv-pyspark35): everything else is
# pinned as in constraints.txt. ARGS go to pytest.
#
#   scripts/test-pyspark35.sh [ARGS]
#   scripts/test-pyspark35.sh --install-only   (the environment alone: CI makes it beside the suite)
#   scripts/test-pyspark35.sh --installed [ARGS]   (the tests alone, in the environment made before)
#
# Spark Connect is not run here: pyspark 3.5's package ships no Connect server.
set -euo pipefail
cd "$(dirname "$0")/.."
PYSPARK35=3.5.9
VENV="$(pwd)/.venv-pyspark35"
PY="$VENV/bin/python"
say() { printf '\033[1m[sparktrain]\033[0m %s\n' "$*"; }

install() {
    if [ ! -x "$PY" ]; then
        say "creating $VENV for pyspark $PYSPARK35"
        "${PYTHON:-python3}" -m venv "$VENV"
    fi
    sed "s/^pyspark==.*/pyspark==$PYSPARK35/" constraints.txt > "$VENV/constraints.txt"
    "$PY" -m pip install -q -c "$VENV/constraints.txt" torch setuptools wheel
    "$PY" -m pip install -q -c "$VENV/constraints.txt" -r requirements/test.txt \
        -e ".[spark,connect,data,examples,tracking,docs]"
}
case "${1:-}" in
    --install-only) install; exit 0 ;;
    --installed) shift ;;
    *) install ;;
esac
export PYSPARK_PYTHON="$PY"
say "running the runner tests with pyspark $("$PY" -c 'import pyspark; print(pyspark.__version__)')"
exec "$PY" -m pytest -q -rs -m "not horovod" tests/spark/test_runner.py tests/spark/test_restarts.py "$@"
