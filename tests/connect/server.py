"""Start and stop pyspark's own Spark Connect server as a child process (tests, benchmarks).

What ``sbin/start-connect-server.sh`` runs (``spark-submit --class ...SparkConnectServer``),
in a process session of its own, listening on loopback only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.helpers import remove_fake_gpus

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# Seconds for the server to listen (14-30 s on a busy 2-core machine; over 190 s seen when
# five test runs share it).
SERVER_START = 420.0


class ServerFailed(RuntimeError):
    """The server exited or did not listen in time; the message holds its log's tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


@contextlib.contextmanager
def connect_server(
    master: str, conf: Mapping[str, str], log: Path, pythonpath: list[str]
) -> Iterator[str]:
    """A running Connect server on ``master``; yields its ``sc://127.0.0.1:PORT`` URL.

    Args:
        master: the server's Spark master, e.g. ``local-cluster[2,1,1024]``.
        conf: more Spark settings for the server.
        log: where the server's output goes.
        pythonpath: folders the executors' Python must import from, first.

    Raises:
        ServerFailed: the server exited, or did not listen within SERVER_START seconds.
    """
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    port = free_port()
    command = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS]
    command += ["--name", "sparktrain-connect", "--master", master]
    settings = {
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        **conf,
    }
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    paths = [*pythonpath, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + SERVER_START
        while not _listening(port):
            if proc.poll() is not None:
                raise ServerFailed(
                    f"the Connect server exited with {proc.returncode}:\n{_tail(log)}"
                )
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"the Connect server did not listen in {SERVER_START:g}s:\n{_tail(log)}"
                )
            time.sleep(0.2)  # polling a port that has no readiness event to wait on
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(proc)
        remove_fake_gpus(proc.pid)  # spark-submit execs the JVM: the process started here


@contextlib.contextmanager
def connect_session(url: str) -> Iterator[object]:
    """A Connect client session on ``url``; the process's Connect marks are put back after."""
    from pyspark.sql import SparkSession

    names = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
    before = {name: os.environ.get(name) for name in names}
    session = SparkSession.builder.remote(url).getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def first_job(session: Any, limit: float = SERVER_START) -> None:
    """Run a fresh server's first job (its executors start their work) on ``session``.

    Raises:
        ServerFailed: the job had not ended within ``limit`` seconds (it is interrupted).
    """
    done = threading.Event()
    errors: list[BaseException] = []

    def body() -> None:
        try:
            session.range(2).collect()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=body, name="connect-first-job", daemon=True).start()
    if not done.wait(limit):
        session.interruptAll()
        raise ServerFailed(f"the Connect server's first job did not end within {limit:g} s")
    if errors:
        raise errors[0]
