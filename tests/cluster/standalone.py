"""A Spark standalone cluster on :class:`~tests.cluster.hosts.Hosts`: the master in the root
namespace on the bridge's address, one Worker per host in that host's namespaces."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.cluster.hosts import Host, Hosts

MASTER_PORT = 7077
DAEMON_LOG_CONF = Path(__file__).with_name("log4j2-daemons.properties")


def spark_home() -> Path:
    """The Spark that ships inside the pyspark package."""
    import pyspark

    return Path(pyspark.__file__).parent


def _wait_port(address: str, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until something listens on ``address:port`` (or ``proc`` exits: then fail)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name} exited with {proc.returncode}:\n{log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {address}:{port} after 90 s:\n{log.read_text()}")


def _stop_masters_left_on(gateway: str) -> None:
    """SIGKILL a master a killed run left on ``gateway`` (its hosts are claimed: it is not live)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if "org.apache.spark.deploy.master.Master" in cmdline and gateway in cmdline:
            with contextlib.suppress(psutil.Error):
                proc.kill()
                proc.wait(timeout=30)


def _registered_workers(logs: list[Path]) -> int:
    return sum("Successfully registered with master" in log.read_text() for log in logs)


class StandaloneCluster:
    """A master and one Worker per host; :meth:`close` stops them and the hosts.

    Args:
        hosts: the hosts, already started.
        cores: cores each Worker offers.
        memory: memory each Worker offers (Spark's notation, e.g. ``"1g"``).
        gpus: fake GPUs each Worker offers (0: no GPU resource).
    """

    def __init__(self, hosts: Hosts, cores: int = 2, memory: str = "1g", gpus: int = 0) -> None:
        self.hosts = hosts
        self.cores = cores
        self.memory = memory
        self.gpus = gpus
        self.dir = Path(tempfile.mkdtemp(prefix=f"sparktrain-{hosts.prefix}-"))
        self.master_url = f"spark://{hosts.gateway}:{MASTER_PORT}"
        self._master: subprocess.Popen[bytes] | None = None
        self.worker_logs: dict[str, Path] = {}

    def _env(self, address: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP=address,
            SPARK_LOCAL_HOSTNAME=address,
            SPARK_DAEMON_MEMORY="256m",
            SPARK_DAEMON_JAVA_OPTS=f"-Dlog4j2.configurationFile=file:{DAEMON_LOG_CONF}",
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOG_DIR=str(self.dir),
        )
        return env

    def start(self) -> StandaloneCluster:
        """Start the master, then the Workers, and wait until every Worker has registered."""
        spark_class = str(spark_home() / "bin" / "spark-class")
        log = self.dir / "master.log"
        _stop_masters_left_on(self.hosts.gateway)
        with log.open("ab") as out:
            self._master = subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    *("--host", self.hosts.gateway, "--port", str(MASTER_PORT)),
                    *("--webui-port", "0"),
                ],
                env=self._env(self.hosts.gateway),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_port(self.hosts.gateway, MASTER_PORT, self._master, log)
        workers = []
        for host in self.hosts.hosts:
            workers.append(self._start_worker(spark_class, host))
        deadline = time.monotonic() + 90
        logs = list(self.worker_logs.values())
        while _registered_workers(logs) < len(logs):
            for proc, wlog in zip(workers, logs, strict=True):
                if proc.poll() is not None:
                    raise RuntimeError(f"{wlog.name} exited:\n{wlog.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError("Workers did not register in 90 s:\n" + self.logs())
            time.sleep(0.2)
        return self

    def _start_worker(self, spark_class: str, host: Host) -> subprocess.Popen[bytes]:
        work = self.dir / f"work-{host.name}"
        work.mkdir(exist_ok=True)  # a restarted Worker reuses its host's folder
        log = self.dir / f"worker-{host.name}.log"
        self.worker_logs[host.name] = log
        argv = [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            *("--host", host.address, "--cores", str(self.cores), "--memory", self.memory),
            *("--work-dir", str(work), "--webui-port", "0"),
        ]
        env = self._env(host.address)
        if self.gpus:
            script = self.dir / f"gpus-{host.name}.sh"
            ids = ", ".join(f'"{i}"' for i in range(self.gpus))
            script.write_text(f'#!/bin/sh\necho \'{{"name": "gpu", "addresses": [{ids}]}}\'\n')
            script.chmod(0o755)
            env["SPARK_WORKER_OPTS"] = (
                f"-Dspark.worker.resource.gpu.amount={self.gpus} "
                f"-Dspark.worker.resource.gpu.discoveryScript={script}"
            )
        return self.hosts.popen(host, [*argv, self.master_url], env, log)

    def restart_worker(self, host: Host) -> None:
        """Start ``host``'s Worker again (after :meth:`Hosts.kill_host`): the host came back,
        with an empty disk, and registers with the master anew."""
        log = self.worker_logs[host.name]
        before = log.read_text().count("Successfully registered with master")
        proc = self._start_worker(str(spark_home() / "bin" / "spark-class"), host)
        deadline = time.monotonic() + 90
        while log.read_text().count("Successfully registered with master") == before:
            if proc.poll() is not None:
                raise RuntimeError(f"{log.name} exited:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.name}'s Worker did not register in 90 s:\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        """Every daemon's log, for a failure message."""
        return "\n".join(f"== {p.name}\n{p.read_text()}" for p in sorted(self.dir.glob("*.log")))

    def executor_logs(self) -> str:
        """Every executor's stderr, for a failure message."""
        return "\n".join(
            f"== {p.relative_to(self.dir)}\n{p.read_text()[-4000:]}"
            for p in sorted(self.dir.glob("work-*/*/*/stderr"))
        )

    def close(self) -> None:
        """Stop the Workers (with everything on their hosts) and the master."""
        try:
            self.hosts.close()
        finally:
            if self._master is not None and self._master.poll() is None:
                os.killpg(self._master.pid, signal.SIGKILL)
                self._master.wait(timeout=30)
            # Logs and Workers' folders: failures have quoted what they needed by now.
            shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def standalone_cluster(
    prefix: str, net: int, hosts: int, cores: int, gpus: int = 0
) -> Iterator[StandaloneCluster]:
    """A started cluster; stopped, with its hosts, whatever happens inside the block."""
    made = Hosts(prefix, net, hosts)
    cluster = StandaloneCluster(made, cores=cores, gpus=gpus)
    try:
        made.start()
        cluster.start()
        yield cluster
    finally:
        cluster.close()
