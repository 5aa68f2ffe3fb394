"""The probes of ``sparktrain doctor``: each looks at one thing and returns :class:`Check` rows.

A probe never raises for what it finds missing or broken: that is a ``fail`` (or ``warn``,
``skip``) row with its fix. Anything slow or that may crash (importing torch or Horovod,
starting Spark) runs in a subprocess with a timeout, through :func:`_command` and
:func:`_python_json`, the two ways probes look outside (tests replace them).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparktrain.config.conf_file import read_conf_file

OK, FAIL, WARN, SKIP = "ok", "fail", "warn", "skip"
ESSENTIALS = ("python", "torch")
MIN_PYTHON = (3, 10)
PROBE_TIMEOUT = 120.0
SPARK_TIMEOUT = 240.0
TORCH_FIX = (
    "pip install torch (CPU only: pip install torch --index-url "
    "https://download.pytorch.org/whl/cpu)"
)
HOROVOD_FIX = (
    "HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 "
    "HOROVOD_WITHOUT_MXNET=1 pip install --no-build-isolation --no-cache-dir "
    "horovod (torch >= 2.1 needs C++17: run `sparktrain install-horovod`)"
)
GPU_CONF_FIX = (
    "set spark.executor.resource.gpu.amount=<GPUs per executor>, "
    "spark.task.resource.gpu.amount=1 and spark.executor.resource.gpu."
    "discoveryScript=$SPARK_HOME/examples/src/main/scripts/getGpusResources.sh "
    "(spark-defaults.conf, or --conf)"
)


@dataclasses.dataclass(frozen=True)
class Check:
    """One row of the report.

    Attributes:
        name: what was checked.
        status: ``ok``, ``fail``, ``warn`` or ``skip`` (not applicable or not asked for).
        detail: what was found.
        fix: how to fix it, for ``fail`` and ``warn``.
        essential: whether sparktrain cannot work without it.
    """

    name: str
    status: str
    detail: str
    fix: str = ""
    essential: bool = False


@dataclasses.dataclass(frozen=True)
class Output:
    """A finished command: its exit code and its stdout and stderr together."""

    returncode: int
    text: str


# -- the two ways probes look outside (tests replace these) -------------------------------


def _command(
    argv: Sequence[str], timeout: float = PROBE_TIMEOUT, env: dict[str, str] | None = None
) -> Output | None:
    """Run a program; None when it is not installed. A timeout gives returncode -9."""
    try:
        done = subprocess.run(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        return Output(126, str(exc))
    except subprocess.TimeoutExpired:
        return Output(-9, f"timed out after {timeout:g}s")
    return Output(done.returncode, done.stdout or "")


def _python_json(
    code: str,
    timeout: float = PROBE_TIMEOUT,
    python: str | None = None,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """Run ``code`` in a fresh interpreter; (its last stdout line as JSON, or None; output)."""
    out = _command([python or sys.executable, "-c", code], timeout, env)
    if out is None:
        return None, f"{python or sys.executable} not found"
    for line in reversed(out.text.strip().splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                break
            if out.returncode == 0 and isinstance(data, dict):
                return data, out.text
            break
    return None, out.text


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def _flags(data: Mapping[str, Any], names: Sequence[str]) -> str:
    """``gloo yes, nccl no``: which of ``names`` are true in ``data``."""
    return ", ".join(f"{name} {'yes' if data.get(name) else 'no'}" for name in names)


# -- probes ------------------------------------------------------------------------------


def check_python() -> list[Check]:
    """This interpreter is new enough."""
    detail = f"{platform.python_version()} ({sys.executable})"
    if sys.version_info[:2] < MIN_PYTHON:
        fix = f"use Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer"
        return [Check("python", FAIL, detail, fix, essential=True)]
    return [Check("python", OK, detail, essential=True)]


def check_sparktrain() -> list[Check]:
    """Which sparktrain runs, and from where."""
    try:
        version = importlib.metadata.version("sparktrain")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed as a package"
    where = Path(__file__).resolve().parent
    return [Check("sparktrain", OK, f"{version} ({where})")]


_TORCH_CODE = """
import json, torch
cuda = torch.cuda.is_available()
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "available": cuda,
                  "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                  if cuda else [], "gloo": torch.distributed.is_gloo_available(),
                  "nccl": torch.distributed.is_nccl_available()}))
"""


def check_torch(gpus: list[str]) -> list[Check]:
    """Torch imports, and sees CUDA devices where this machine has ``gpus``."""
    if importlib.util.find_spec("torch") is None:
        return [Check("torch", FAIL, "not installed", TORCH_FIX, essential=True)]
    data, text = _python_json(_TORCH_CODE)
    if data is None:
        detail = f"installed but `import torch` fails: {_last_line(text)}"
        return [Check("torch", FAIL, detail, "reinstall torch: " + TORCH_FIX, essential=True)]
    build = f"CUDA {data['cuda']}" if data.get("cuda") else "CPU build"
    detail = f"{data['version']} ({build}; {_flags(data, ('gloo', 'nccl'))})"
    rows = [Check("torch", OK, detail, essential=True)]
    devices = data.get("devices") or []
    if devices:
        rows.append(Check("torch cuda", OK, f"{len(devices)} device(s): {', '.join(devices)}"))
    elif gpus:
        detail = f"this machine has {len(gpus)} GPU(s) but torch sees none ({build})"
        fix = (
            "install a CUDA build of torch (pip install torch --index-url "
            "https://download.pytorch.org/whl/cu126) and check the driver "
            "(nvidia-smi), CUDA_VISIBLE_DEVICES"
        )
        rows.append(Check("torch cuda", FAIL, detail, fix))
    else:
        rows.append(Check("torch cuda", SKIP, "no GPU on this machine"))
    return rows


def _java_major(text: str) -> int | None:
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8.0_292" is Java 8


def installed_pyspark_version() -> str | None:
    """The installed pyspark's version, or None when pyspark is not installed."""
    if importlib.util.find_spec("pyspark") is None:
        return None
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


def check_java(pyspark_version: str | None) -> list[Check]:
    """A Java that this pyspark can run on, from JAVA_HOME or else PATH."""
    # Spark 4 needs Java 17; Spark 3.5 runs on 8, 11 and 17.
    needed = 8 if pyspark_version and pyspark_version[:2] in ("3.", "2.") else 17
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if java_home and not os.path.exists(java or ""):
        fix = f"point JAVA_HOME at a Java {needed}+ installation, or unset it"
        return [Check("java", FAIL, f"JAVA_HOME={java_home} has no bin/java", fix)]
    fix = (
        f"install Java {needed}+ (apt-get install openjdk-17-jre-headless) and set JAVA_HOME to it"
    )
    out = _command([java, "-version"]) if java else None
    if out is None:
        return [Check("java", FAIL, "not found (JAVA_HOME unset, no java on PATH)", fix)]
    major = _java_major(out.text)
    if major is None or out.returncode != 0:
        return [Check("java", FAIL, f"`{java} -version` failed: {_last_line(out.text)}", fix)]
    where = f"JAVA_HOME={java_home}" if java_home else f"{java} from PATH; JAVA_HOME unset"
    if major < needed:
        return [Check("java", FAIL, f"Java {major} ({where}); Spark needs {needed}+", fix)]
    return [Check("java", OK, f"{out.text.strip().splitlines()[0]} ({where})")]


def check_pyspark(pyspark_version: str | None) -> list[Check]:
    """Pyspark is installed, and the executors' Python (PYSPARK_PYTHON) imports sparktrain."""
    if pyspark_version is None:
        fix = (
            "pip install 'sparktrain[spark]' (or pip install pyspark), or use "
            "np < 0 to run on the driver alone"
        )
        return [Check("pyspark", FAIL, "not installed (needed for np > 0)", fix)]
    found = Check("pyspark", OK, pyspark_version)
    python = os.environ.get("PYSPARK_PYTHON")
    if not python:
        detail = (
            "PYSPARK_PYTHON unset: on a local master sparktrain's jobs run this interpreter; "
            "elsewhere executors run `python3` from their PATH (checked before each run)"
        )
        fix = (
            f"export PYSPARK_PYTHON={sys.executable} (or set "
            "spark.pyspark.python) to an interpreter with sparktrain and torch"
        )
        return [found, Check("executor python", WARN, detail, fix)]
    from sparktrain.shipping.python_probe import ENTRY_MODULES

    data, text = _python_json(
        f"import json, {', '.join(ENTRY_MODULES)}; print(json.dumps({{'ok': True}}))",
        python=python,
    )
    if data is None:
        detail = f"PYSPARK_PYTHON={python} cannot import sparktrain: {_last_line(text)}"
        fix = f"install sparktrain into {python}, or point PYSPARK_PYTHON at {sys.executable}"
        return [found, Check("executor python", FAIL, detail, fix)]
    return [found, Check("executor python", OK, f"PYSPARK_PYTHON={python} imports sparktrain")]


_HOROVOD_CODE = """
import json, horovod, horovod.torch as hvd
print(json.dumps({"version": horovod.__version__, "gloo": bool(hvd.gloo_built()),
                  "mpi": bool(hvd.mpi_built()), "nccl": bool(hvd.nccl_built())}))
"""


def check_horovod() -> list[Check]:
    """Horovod, where installed, imports with torch and was built with Gloo or MPI."""
    from sparktrain.backends.horovod_install import installed_horovod

    if installed_horovod() is None:  # the driver's stand-in is not Horovod
        detail = (
            "not installed: HorovodRunner runs on sparktrain's built-in horovod.torch "
            "(Horovod itself is needed only for launcher='mpi' and what the built-in one lacks)"
        )
        return [Check("horovod", SKIP, detail, HOROVOD_FIX)]
    data, text = _python_json(_HOROVOD_CODE)
    if data is None:
        detail = f"installed but `import horovod.torch` fails: {_last_line(text)}"
        fix = "rebuild it against this torch: pip uninstall -y horovod; " + HOROVOD_FIX
        return [Check("horovod", FAIL, detail, fix)]
    built = _flags(data, ("gloo", "mpi", "nccl"))
    if not (data.get("gloo") or data.get("mpi")):
        detail = f"{data['version']} built without Gloo or MPI ({built})"
        return [Check("horovod", FAIL, detail, "rebuild with HOROVOD_WITH_GLOO=1: " + HOROVOD_FIX)]
    return [Check("horovod", OK, f"{data['version']} ({built})")]


def check_mpirun() -> list[Check]:
    """Which mpirun is on PATH, if any."""
    path = shutil.which("mpirun")
    if path is None:
        fix = (
            "apt-get install openmpi-bin libopenmpi-dev, then rebuild Horovod with "
            "HOROVOD_WITH_MPI=1"
        )
        return [Check("mpirun", SKIP, "not found (needed only for launcher='mpi')", fix)]
    out = _command([path, "--version"], timeout=30)
    version = _last_line(out.text.splitlines()[0]) if out and out.text.strip() else "unknown"
    return [Check("mpirun", OK, f"{version} ({path})")]


def probe_gpus() -> tuple[list[str], str]:
    """The GPUs ``nvidia-smi -L`` lists, and why there are none when there are none."""
    out = _command(["nvidia-smi", "-L"], timeout=30)
    if out is None:
        return [], "nvidia-smi not found"
    if out.returncode != 0:
        return [], f"nvidia-smi failed: {_last_line(out.text)}"
    return [line.strip() for line in out.text.splitlines() if line.startswith("GPU ")], ""


def check_gpus(gpus: list[str], why: str) -> list[Check]:
    """The GPUs :func:`probe_gpus` found, or ``why`` there are none."""
    if not gpus:
        return [Check("gpus", SKIP, f"none ({why})" if why else "none")]
    return [Check("gpus", OK, f"{len(gpus)}: " + "; ".join(g.split(" (UUID")[0] for g in gpus))]


def spark_defaults() -> tuple[dict[str, str], str | None]:
    """The settings in spark-defaults.conf (SPARK_CONF_DIR, SPARK_HOME/conf or pyspark's).

    Returns:
        The settings and the file's path; ``({}, None)`` when there is no such file.
    """
    dirs = [os.environ.get("SPARK_CONF_DIR")]
    if os.environ.get("SPARK_HOME"):
        dirs.append(os.path.join(os.environ["SPARK_HOME"], "conf"))
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.submodule_search_locations:
        dirs.append(os.path.join(list(spec.submodule_search_locations)[0], "conf"))
    for directory in filter(None, dirs):
        path = os.path.join(directory, "spark-defaults.conf")
        if os.path.isfile(path):
            return read_conf_file(path), path
    return {}, None


def check_spark_gpus(
    gpus: list[str], pyspark_version: str | None, conf: dict[str, str], where: str | None
) -> list[Check]:
    """Spark is told to schedule this machine's ``gpus`` (``conf`` read from ``where``)."""
    if pyspark_version is None:
        return [Check("spark gpus", SKIP, "pyspark is not installed")]
    amount = conf.get("spark.executor.resource.gpu.amount")
    script = conf.get("spark.executor.resource.gpu.discoveryScript") or conf.get(
        "spark.worker.resource.gpu.discoveryScript"
    )
    source = where or "no spark-defaults.conf found"
    if not amount:
        if gpus:
            detail = (
                f"this machine has {len(gpus)} GPU(s) but Spark "
                f"is not told to schedule them ({source})"
            )
            return [Check("spark gpus", FAIL, detail, GPU_CONF_FIX)]
        return [Check("spark gpus", SKIP, f"not configured, no GPU here ({source})")]
    detail = (
        f"spark.executor.resource.gpu.amount={amount}, task amount "
        f"{conf.get('spark.task.resource.gpu.amount', 'unset')} ({source})"
    )
    if not script:
        fix = (
            "set spark.executor.resource.gpu.discoveryScript unless the cluster "
            "manager (YARN, Kubernetes) discovers GPUs itself"
        )
        return [Check("spark gpus", WARN, f"{detail}; no discovery script", fix)]
    if not os.access(script, os.X_OK):
        detail += f"; discovery script {script} is missing or not executable"
        return [Check("spark gpus", FAIL, detail, f"chmod +x {script}, or fix its path")]
    return [Check("spark gpus", OK, f"{detail}; discovery script {script}")]
