"""What ``sparktrain doctor`` finds on one executor: versions, GPUs, network interfaces, and
whether a checkpoint URL written from another host can be read here.

This module is shipped to the executors as source text and run there with :func:`exec` (see
:mod:`sparktrain.commands.doctor_cluster`), so it imports nothing from sparktrain at module level: it
must work on an executor where sparktrain is missing or a different version, which is among
the things it reports.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import ipaddress
import os
import platform
import socket
from collections.abc import Iterator, Mapping
from typing import Any

PROBE_FILE = ".sparktrain-doctor-{token}"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Python's and the packages' versions that must match the driver's (from the installed
    packages' metadata: nothing is imported, so a broken torch still shows its version)."""
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "cloudpickle": _version("cloudpickle"),
        "sparktrain": _version("sparktrain"),
    }


def interfaces() -> dict[str, list[str]]:
    """Every interface's IPv4 addresses, by name (loopback left out)."""
    try:
        import psutil
    except ImportError:
        return {name: [] for _, name in socket.if_nameindex() if name != "lo"}
    found: dict[str, list[str]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        if name == "lo":
            continue
        found[name] = sorted(a.address for a in addrs if a.family == socket.AF_INET)
    return found


def chosen_interface(host: str, found: dict[str, list[str]]) -> str | None:
    """The interface sparktrain gives Gloo, NCCL, Horovod and MPI for an executor at
    ``host``: the one holding the address Spark knows the executor by.

    ``found`` (what :func:`interfaces` lists, loopback left out) answers only where
    sparktrain cannot be imported here; a loopback address (``SPARK_LOCAL_IP=127.0.0.1``,
    a master on this machine) is then the loopback interface's, as sparktrain would find.
    """
    try:
        from sparktrain.task.entry import interface_of
    except Exception:  # noqa: BLE001 - sparktrain missing or broken here: say what it would
        try:
            ip = socket.gethostbyname(host)
        except OSError:
            return None
        named = next((name for name, addrs in found.items() if ip in addrs), None)
        return named or (_loopback_name() if ipaddress.ip_address(ip).is_loopback else None)
    return interface_of(host)


def _loopback_name() -> str:
    """The loopback interface's name: ``lo`` on Linux, ``lo0`` on macOS."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    return next((name for name in names if name.startswith("lo")), "lo")


def write_probe(url: str, token: str) -> str | None:
    """Write the probe file under ``url``; None when that worked, else why not."""
    try:
        import fsspec

        with fsspec.open(f"{url.rstrip('/')}/{PROBE_FILE.format(token=token)}", "w") as f:
            f.write(token)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"{type(exc).__name__}: {exc}"
    return None


def read_probe(url: str, token: str) -> str | None:
    """Read the probe file back; None when it holds ``token``, else what went wrong."""
    try:
        import fsspec

        with fsspec.open(f"{url.rstrip('/')}/{PROBE_FILE.format(token=token)}", "r") as f:
            text = f.read()
    except FileNotFoundError:
        return "not found here"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return f"{type(exc).__name__}: {exc}"
    return None if text == token else "found, but with other contents"


def remove_probe(url: str, token: str) -> None:
    """Remove the probe file (best effort)."""
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(f"{url.rstrip('/')}/{PROBE_FILE.format(token=token)}")
        fs.rm(path)
    except Exception:  # noqa: BLE001 - a leftover probe file harms nothing
        pass


@contextlib.contextmanager
def _environ(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set for the block only: Spark reuses a Python worker for later tasks."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def probe(
    context: Any, checkpoint: str | None, token: str, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Everything this task reports; the first task writes the checkpoint probe, every task
    reads it back after a barrier.

    Args:
        context: the task's BarrierTaskContext.
        checkpoint: the URL to check, if any.
        token: this check's own file name part and contents.
        env: environment for reaching the URL (credentials, an endpoint), as a run's ranks
            get it from ``SparkRunner(env=...)``.
    """
    index = context.partitionId()
    executor = context.getTaskInfos()[index].address
    host = executor.rpartition(":")[0]
    found = interfaces()
    resources = context.resources()
    report: dict[str, Any] = {
        "index": index,
        "host": host,
        "executor": executor,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "versions": versions(),
        "gpus": list(resources["gpu"].addresses) if "gpu" in resources else [],
        "interfaces": found,
        "chosen": chosen_interface(host, found),
    }
    if checkpoint:
        with _environ(env or {}):
            written = write_probe(checkpoint, token) if index == 0 else None
            context.barrier()  # the file is there (or failed) before anyone looks
            report["write_error"] = written
            report["read_error"] = read_probe(checkpoint, token)
            context.barrier()  # everyone has looked before it goes
            if index == 0:
                remove_probe(checkpoint, token)
    return report
