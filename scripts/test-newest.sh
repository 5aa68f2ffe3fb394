#!/usr/bin/env bash
# The newest versions of every dependency sparktrain does not pin, as `pip install sparktrain`
# without a constraints file gives them, in a virtual environment of its own (.venv-newest):
# the unit tier, then a Spark smoke run (a run, a failed rank's traceback, a timeout's stack
# dump, the executors' Python probe). Then the tracebacks' tests again with the lowest
# cloudpickle pyproject.toml allows. ARGS go to the unit tier's pytest.
#
#   scripts/test-newest.sh [ARGS]
#   scripts/test-newest.sh --install-only   (the environment alone: CI makes it beside the suite)
#   scripts/test-newest.sh --installed [ARGS]   (the tests alone, in the environment made before)
#
# torch alone keeps its pin (the CPU build): the newest torch on PyPI is the CUDA build, several
# GB that a CPU machine cannot use, and a torch release changes what the ranks run far more
# than any other dependency does; a new torch is adopted by moving the pin, with the whole suite.
# Horovod is not built here (its build takes minutes): its tests are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$(pwd)/.venv-newest"
PY="$VENV/bin/python"
CLOUDPICKLE_LOWEST=3.0.0   # keep in step with pyproject.toml's cloudpickle>=
say() { printf '\033[1m[sparktrain]\033[0m %s\n' "$*"; }

install() {
    if [ ! -x "$PY" ]; then
        say "creating $VENV"
        "${PYTHON:-python3}" -m venv "$VENV"
    fi
    grep '^torch==' sparktrain/constraints.txt > "$VENV/torch-only.txt"
    "$PY" -m pip install -q -c "$VENV/torch-only.txt" torch setuptools wheel
    # eager: a reused environment moves to releases made since it was created
    "$PY" -m pip install -q --upgrade --upgrade-strategy eager \
        -c "$VENV/torch-only.txt" -r requirements/test.txt \
        -e ".[spark,connect,data,examples,tracking,docs]"
    "$PY" -m pip check
}
case "${1:-}" in
    --install-only) install; exit 0 ;;
    --installed) shift ;;
    *) install ;;
esac
say "newest: $("$PY" -m pip list --format=freeze 2>/dev/null |
    grep -iE '^(cloudpickle|psutil|pyspark|pyarrow|pandas|numpy|fsspec|torch)==' | tr '\n' ' ')"
export PYSPARK_PYTHON="$PY"
# Every part runs even when one before it failed; the exit status says whether any did.
status=0
say "the unit tier"
# Its modules spread over TEST_WORKERS processes (default 2): the suite's own scheduling keeps the
# tier on one worker beside the spark tier's modules, but here it runs alone.
"$PY" -m pytest -q -rs -p no:cacheprovider -n "${TEST_WORKERS:-2}" --dist loadfile \
    -m "not horovod" tests/unit "$@" || status=1
say "a Spark smoke run"
"$PY" -m pytest -q -rs -p no:cacheprovider -m "not horovod" tests/spark/test_python_probe.py \
    tests/spark/test_runner.py \
    -k "probe or returns_rank0_value or failed_rank_stops_everything or run_timeout_stops_ranks" ||
    status=1
say "tracebacks with cloudpickle $CLOUDPICKLE_LOWEST, the lowest pyproject.toml allows"
"$PY" -m pip install -q "cloudpickle==$CLOUDPICKLE_LOWEST"
"$PY" -m pytest -q -rs -p no:cacheprovider tests/unit/test_payload_lines.py \
    tests/unit/test_payload.py || status=1
"$PY" -m pip install -q --upgrade cloudpickle
exit "$status"
