#!/usr/bin/env bash
# Make `import horovod.torch` work in a Python environment, with the recipe that builds
# Horovod 0.28.1 against torch >= 2.1 (a C++17 compiler wrapper, a cmake that accepts
# Horovod's bundled gloo).
#
# Usage:
#   sparktrain install-horovod [--python PYTHON]     (from the installed package)
#   scripts/install-horovod.sh [PYTHON]              (from a checkout of sparktrain)
#
#   PYTHON                 the interpreter whose environment gets Horovod: argument 1, else
#                          $PYTHON, else the checkout's .venv/bin/python, else python3.
#   HOROVOD_VERSION        version to build (default 0.28.1, the last release).
#   HOROVOD_BUILD_JOBS     parallel compile jobs (default: the number of cores, at most 2
#                          per 4 GiB of memory; torch's headers make each job ~1.5 GiB).
#   HOROVOD_INSTALL_MPI=0  do not apt-get install Open MPI even when running as root.
#   HOROVOD_FORCE=1        rebuild/reinstall even when horovod.torch already imports.
#
# What it does:
#   1. exits at once when horovod.torch already imports (and prints what it was built with);
#   2. as root, installs Open MPI with apt when mpirun is missing (goes on without it if apt
#      fails);
#   3. builds horovod==$HOROVOD_VERSION with Gloo (and MPI when mpicxx exists) using a
#      compiler wrapper that turns -std=c++11/14 into -std=c++17 (torch's headers need it)
#      and a cmake that accepts Horovod's bundled gloo;
#   4. checks `hvd.init()` and prints what was built.
# pip keeps the wheel it built in its cache (`pip cache dir`), so a second run on the same
# machine (or for another environment with the same Python and torch) installs in seconds.
# pip does not key that cache by torch version: when a cached wheel does not load with this
# environment's torch, the script drops it and builds again.
set -euo pipefail

# A checkout's wrapper (scripts/install-horovod.sh) names the checkout: its .venv, its
# constraints.txt and its .cache folder are then used. From the installed package, none.
REPO="${SPARKTRAIN_REPO:-}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"

case "${1:-}" in
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
esac

DEFAULT_PY=python3
[[ -n "$REPO" ]] && DEFAULT_PY="$REPO/.venv/bin/python"
PY="${1:-${PYTHON:-$DEFAULT_PY}}"
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "install-horovod: no Python interpreter at '$PY' (name one: sparktrain install-horovod --python PATH, or scripts/install-horovod.sh PATH in a checkout)" >&2
    exit 2
fi
PY="$(command -v "$PY")"
PYBIN="$(dirname "$PY")"

say() { printf 'install-horovod: %s\n' "$*"; }
warn() { printf 'install-horovod: WARNING: %s\n' "$*" >&2; }

# What horovod.torch was built with (what `horovodrun --check-build` shows, with one torch
# import instead of three); fails when it does not import.
report_build() {
    "$PY" - <<'EOF'
import shutil

import horovod
import horovod.torch as hvd

built = {"Gloo": hvd.gloo_built(), "MPI": hvd.mpi_built(), "NCCL": bool(hvd.nccl_built())}
names = "+".join(name for name, ok in built.items() if ok) or "nothing"
print(f"install-horovod: horovod {horovod.__version__} with torch imports; built with {names}")
if not built["MPI"]:
    if shutil.which("mpicxx"):
        print("install-horovod: MPI is installed now but Horovod was built without it;"
              " HOROVOD_FORCE=1 rebuilds it with MPI")
    else:
        print("install-horovod: MPI tests will be skipped: install openmpi-bin libopenmpi-dev"
              " and rebuild with HOROVOD_FORCE=1")
EOF
}

if [[ "${HOROVOD_FORCE:-0}" != 1 ]] && report_build 2>/dev/null; then
    exit 0
fi

# --- prerequisites ---------------------------------------------------------------------
IS_ROOT=0
[[ "$(id -u)" == 0 ]] && IS_ROOT=1

apt_install() {
    # Quiet apt; refresh the package lists only when the first attempt fails.
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 && return 0
    apt-get update -qq >/dev/null 2>&1 || return 1
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1
}

if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicxx >/dev/null 2>&1; then
    if [[ "$IS_ROOT" == 1 && "${HOROVOD_INSTALL_MPI:-1}" != 0 ]] && command -v apt-get >/dev/null; then
        say "installing Open MPI (apt-get install openmpi-bin libopenmpi-dev)..."
        if apt_install openmpi-bin libopenmpi-dev; then
            say "Open MPI installed: $(mpirun --version 2>/dev/null | head -n1)"
        else
            warn "apt-get could not install openmpi-bin libopenmpi-dev; building without MPI" \
                "(Gloo only; MPI tests will be skipped)"
        fi
    else
        say "no MPI here: building with Gloo only. MPI tests will be skipped: install" \
            "openmpi-bin libopenmpi-dev (as root: apt-get install openmpi-bin libopenmpi-dev)" \
            "and run this script again with HOROVOD_FORCE=1"
    fi
fi

GXX="$(command -v g++ || true)"
if [[ -z "$GXX" && "$IS_ROOT" == 1 ]] && command -v apt-get >/dev/null; then
    say "installing g++ (apt-get install g++)..."
    apt_install g++ make || true
    GXX="$(command -v g++ || true)"
fi
if [[ -z "$GXX" ]]; then
    echo "install-horovod: no g++ found; install a C++17 compiler (apt-get install g++) and run again" >&2
    exit 1
fi

# Horovod 0.28.1's bundled gloo declares cmake_minimum_required < 3.5, which cmake 4 (the
# one pip installs) rejects. Prefer a cmake 3 from the system; otherwise tell cmake 4 to
# accept it.
CMAKE_BIN=""
for candidate in /usr/bin/cmake /usr/local/bin/cmake "$(command -v cmake3 || true)" "$(command -v cmake || true)"; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then
        CMAKE_BIN="$candidate"
        break
    fi
done
if [[ -z "$CMAKE_BIN" && "$IS_ROOT" == 1 ]] && command -v apt-get >/dev/null; then
    say "installing cmake (apt-get install cmake)..."
    apt_install cmake || true
    CMAKE_BIN="$(command -v cmake || true)"
fi
if [[ -z "$CMAKE_BIN" ]]; then
    say "no cmake found; installing cmake<4 from PyPI into the environment"
    "$PY" -m pip install -q 'cmake>=3.13,<4'
    CMAKE_BIN="$PYBIN/cmake"
fi
export CMAKE_POLICY_VERSION_MINIMUM=3.5

# --- Python build dependencies -----------------------------------------------------------
CONSTRAINTS=()
if [[ -n "$REPO" && -f "$REPO/constraints.txt" ]]; then
    CONSTRAINTS=(-c "$REPO/constraints.txt")
fi
# The wheel cache is what makes a second run fast: never let the caller's pip settings
# switch it off for this script.
if [[ -n "${PIP_NO_CACHE_DIR:-}" ]]; then
    warn "ignoring PIP_NO_CACHE_DIR=$PIP_NO_CACHE_DIR so the built wheel is cached"
    unset PIP_NO_CACHE_DIR
fi
say "installing build dependencies (torch numpy cloudpickle psutil pyyaml packaging setuptools wheel)..."
"$PY" -m pip install -q "${CONSTRAINTS[@]}" torch numpy cloudpickle psutil pyyaml packaging \
    setuptools wheel

# --- build -------------------------------------------------------------------------------
if [[ -n "$REPO" ]]; then
    WORK="$REPO/.cache/horovod-build"
else
    WORK="${XDG_CACHE_HOME:-$HOME/.cache}/sparktrain/horovod-build"
fi
if ! mkdir -p "$WORK" 2>/dev/null || [[ ! -w "$WORK" ]]; then
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
fi
LOG="$WORK/build.log"
CXX_WRAPPER="$WORK/cxx17"
cat >"$CXX_WRAPPER" <<EOF
#!/usr/bin/env bash
# g++ with Horovod's forced -std=c++11/-std=c++14 raised to -std=c++17 (torch >= 2.1 headers).
args=()
for arg in "\$@"; do
    case "\$arg" in
        -std=c++11 | -std=c++14) arg=-std=c++17 ;;
        -std=gnu++11 | -std=gnu++14) arg=-std=gnu++17 ;;
    esac
    args+=("\$arg")
done
exec "$GXX" "\${args[@]}"
EOF
chmod +x "$CXX_WRAPPER"

if [[ -z "${HOROVOD_BUILD_JOBS:-}" ]]; then
    cores="$(nproc 2>/dev/null || echo 2)"
    mem_gib="$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo 2>/dev/null || echo 4)"
    by_mem=$((mem_gib / 2 > 0 ? mem_gib / 2 : 1))
    HOROVOD_BUILD_JOBS=$((cores < by_mem ? cores : by_mem))
fi

export CXX="$CXX_WRAPPER"
export PATH="$(dirname "$CMAKE_BIN"):$PATH"
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
export HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=GLOO
export MAKEFLAGS="-j$HOROVOD_BUILD_JOBS"
WITH="Gloo"
if command -v mpicxx >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    export HOROVOD_WITH_MPI=1
    unset HOROVOD_WITHOUT_MPI
    WITH="Gloo+MPI"
else
    export HOROVOD_WITHOUT_MPI=1
    unset HOROVOD_WITH_MPI
fi

CACHE_DIR="$("$PY" -m pip cache dir 2>/dev/null || true)"
CACHED_WHEEL="horovod-$HOROVOD_VERSION-*"
PIP_EXTRA=()
if [[ "${HOROVOD_FORCE:-0}" == 1 ]]; then
    # A forced rebuild must not take the wheel built last time (maybe without MPI).
    "$PY" -m pip cache remove "$CACHED_WHEEL" >/dev/null 2>&1 || true
    PIP_EXTRA=(--force-reinstall --no-deps)
elif "$PY" -m pip show -q horovod >/dev/null 2>&1; then
    warn "horovod is installed but horovod.torch does not import; reinstalling it"
    PIP_EXTRA=(--force-reinstall --no-deps)
fi

# Install horovod (from pip's wheel cache when it holds one, else built from the sdist),
# printing a progress line a minute; on failure, the end of the log and the likely fix.
install_horovod() {
    if "$PY" -m pip cache list "$CACHED_WHEEL" 2>/dev/null | grep -q horovod; then
        FROM_CACHE=1
        say "installing Horovod $HOROVOD_VERSION from pip's wheel cache ($CACHE_DIR/wheels)..."
    else
        FROM_CACHE=0
        say "building Horovod $HOROVOD_VERSION with $WITH, ~4-12 min on $HOROVOD_BUILD_JOBS" \
            "core(s)... (log: $LOG; $("$CMAKE_BIN" --version | head -n1))"
    fi
    local start=$SECONDS rc pid step
    # -v puts the compiler's output in the log, which is what a failure needs.
    "$PY" -m pip install -v --no-build-isolation "${CONSTRAINTS[@]}" "${PIP_EXTRA[@]}" \
        "horovod==$HOROVOD_VERSION" >"$LOG" 2>&1 &
    pid=$!
    trap 'kill "$pid" 2>/dev/null || true' INT TERM
    while kill -0 "$pid" 2>/dev/null; do
        for _ in $(seq 60); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 1
        done
        if kill -0 "$pid" 2>/dev/null; then
            step="$(grep -aoE '\[ *[0-9]+%\] [A-Za-z]+[^/]*[^ ]*' "$LOG" 2>/dev/null | tail -n1 || true)"
            say "... $(((SECONDS - start) / 60)) min ${step:+- $step}"
        fi
    done
    if wait "$pid"; then rc=0; else rc=$?; fi
    trap - INT TERM
    if [[ "$rc" != 0 ]]; then
        explain_failure "$rc"
        exit "$rc"
    fi
    say "pip finished in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
}

explain_failure() {
    echo "install-horovod: pip install horovod==$HOROVOD_VERSION failed (exit $1). Last 40 lines of $LOG:" >&2
    tail -n 40 "$LOG" | sed 's/^/  | /' >&2
    echo "install-horovod: how to fix:" >&2
    if grep -aq 'Compatibility with CMake < 3' "$LOG"; then
        echo "  - cmake >= 4 rejects Horovod's bundled gloo: put a cmake 3 first on PATH (apt-get install cmake) or export CMAKE_POLICY_VERSION_MINIMUM=3.5" >&2
    fi
    if grep -aqE 'C\+\+17|c\+\+17|std::optional|if constexpr' "$LOG"; then
        echo "  - torch's headers need C++17: the build must use the cxx17 wrapper ($CXX_WRAPPER) as CXX; check nothing resets CXX/CMAKE_CXX_COMPILER" >&2
    fi
    if grep -aq 'Python.h' "$LOG"; then
        echo "  - Python headers are missing: install python3-dev (or the matching pythonX.Y-dev)" >&2
    fi
    if grep -aq 'mpi.h' "$LOG"; then
        echo "  - MPI headers are missing: apt-get install libopenmpi-dev, or build without MPI (remove mpicxx from PATH)" >&2
    fi
    if grep -aqiE 'killed signal|out of memory|cannot allocate' "$LOG"; then
        echo "  - the compiler ran out of memory: run again with HOROVOD_BUILD_JOBS=1" >&2
    fi
    if grep -aqiE 'No matching distribution|Could not find a version' "$LOG"; then
        echo "  - pip cannot reach horovod==$HOROVOD_VERSION: check the package index (pip config list)" >&2
    fi
    echo "  - the known-good recipe: torch installed first, then CXX=<c++17 wrapper>," \
        "system cmake 3, HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=GLOO" \
        "HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1," \
        "pip install --no-build-isolation horovod==$HOROVOD_VERSION" >&2
}

install_horovod

# --- check -------------------------------------------------------------------------------
ok=1
report_build || ok=0
if [[ "$ok" == 0 && "$FROM_CACHE" == 1 ]]; then
    # pip's cache keys the wheel by its source, not by the torch it was compiled against: a
    # wheel built for another torch fails to load here. Build one for this environment.
    warn "the cached Horovod wheel does not load with this environment's torch; rebuilding"
    "$PY" -m pip cache remove "$CACHED_WHEEL" >/dev/null 2>&1 || true
    PIP_EXTRA=(--force-reinstall --no-deps)
    install_horovod
    ok=1
    report_build || ok=0
fi
if [[ "$ok" == 0 ]]; then
    echo "install-horovod: horovod installed but 'import horovod.torch' fails; see $LOG and:" >&2
    "$PY" -c 'import horovod.torch' 2>&1 | tail -n 5 | sed 's/^/  | /' >&2
    exit 1
fi
if ! "$PY" -c 'import horovod.torch as hvd; hvd.init(); assert hvd.size() == 1; hvd.shutdown()'; then
    echo "install-horovod: horovod.torch imports but hvd.init() fails in a single process" >&2
    exit 1
fi
say "hvd.init() works. Try: $PYBIN/horovodrun -np 2 --gloo $PY -c 'import horovod.torch as hvd; hvd.init(); print(hvd.rank())'"
