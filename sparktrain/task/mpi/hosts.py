"""The host role of an MPI run, and a member task's link to the launcher.

A host task (local rank 0 on a host other than rank 0's) starts Open MPI's daemon for its
host when mpirun's agent asks, relays the daemon's output and exit code to the agent, and
reports the error records its host's ranks wrote. Every task other than the launcher joins
the launcher through a :class:`LauncherLink` and holds its slot until released.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sparktrain import contract, wire
from sparktrain.task.mpi import command
from sparktrain.task.mpi.run import MpiRun
from sparktrain.task.process import RankProcess
from sparktrain.task.rank_outcomes import clip, read_errors
from sparktrain.wire import protocol

LAUNCHER_LINK = -2  # event id of a member task's connection to the launcher


class HostDaemons:
    """The Open MPI daemons this task starts for the hosts it serves.

    Args:
        run: what this task's roles share.
        index: this task's partition index.
        report: hands a ``daemon_started`` / ``host_done`` message to the launcher.
    """

    def __init__(self, run: MpiRun, index: int, report: Callable[[dict[str, Any]], None]) -> None:
        self.run = run
        daemon_hosts = command.hosts_needing_daemons(run.spec)
        self.serves = (
            set(daemon_hosts)
            if run.local
            else {h for h in daemon_hosts if command.first_task_on(run.spec, h) == index}
        )
        self.report = report
        # agent connection id -> (host, daemon), until the daemon's exit is handled
        self.daemons: dict[int, tuple[str, RankProcess]] = {}
        self.done: set[str] = set()

    def processes(self) -> list[RankProcess]:
        """The daemons not yet handled as ended."""
        return [p for _, p in self.daemons.values()]

    def running(self) -> bool:
        """Whether a daemon process is still alive."""
        return any(p.proc.poll() is None for _, p in self.daemons.values())

    def start(self, conn_id: int, host: str, argv_text: str) -> None:
        """The agent on ``conn_id`` asks for ``host``'s daemon, as ``ssh host argv`` would."""
        server = self.run.server
        started = {h for h, _ in self.daemons.values()} | self.done
        if self.run.stopping or host not in self.serves or host in started:
            why = "stopping" if self.run.stopping else f"this task does not serve {host!r}"
            server.send(conn_id, protocol.RSH_OUTPUT(line=f"sparktrain: {why}"))
            server.send(conn_id, protocol.RSH_EXIT(code=contract.EXIT_CONNECTION_FAILED))
            return

        def on_line(_key: int, line: str) -> None:
            server.send(conn_id, protocol.RSH_OUTPUT(line=line))

        argv = ["/bin/sh", "-c", argv_text]
        proc = self.run.guarded(conn_id, argv, self.run.host_env(host), on_line)
        self.daemons[conn_id] = (host, proc)
        self.report(protocol.DAEMON_STARTED(host=host))

    def on_exit(self, conn_id: int, code: int) -> None:
        """The daemon started for ``conn_id`` has ended with ``code``."""
        host, proc = self.daemons.pop(conn_id)
        self.done.add(host)
        proc.join()
        self.run.reap(host)
        self.run.server.send(conn_id, protocol.RSH_EXIT(code=code))
        errors = read_errors(self.run.workdir, self.run.spec.on_host(host))
        self.report(
            protocol.HOST_DONE(
                host=host,
                code=code,
                errors={str(r): e for r, e in errors.items()},
                tail=clip(proc.tail),
            )
        )

    def on_closed(self, conn_id: int) -> None:
        """mpirun dropped the agent: stop the daemon, as sshd does when a session drops."""
        if conn_id in self.daemons:
            proc = self.daemons[conn_id][1]
            threading.Thread(target=proc.stop, args=(self.run.grace,), daemon=True).start()


class LauncherLink:
    """A member task's connection to the launcher's peer server.

    Messages from the launcher arrive as ``("peer", LAUNCHER_LINK, message)`` events, its end
    as ``("peer_closed", LAUNCHER_LINK, None)``.
    """

    def __init__(self, client: wire.ChannelClient | None) -> None:
        self.client = client
        self.released = False

    @classmethod
    def join(cls, run: MpiRun, index: int) -> LauncherLink:
        """Connect to the launcher and say which task this is."""
        task = run.spec.first.task
        events = run.session.events
        try:
            client = wire.ChannelClient(
                f"{task.host}:{task.port}", run.session.job.key, timeout=run.config.start_timeout
            )
            client.send(protocol.MEMBER(index=index))
        except OSError:
            events.put(("peer_closed", LAUNCHER_LINK, None))
            return cls(None)

        def read() -> None:
            try:
                while True:
                    events.put(("peer", LAUNCHER_LINK, client.receive()))
            except (OSError, EOFError, wire.FrameError):
                if not client.closed:
                    events.put(("peer_closed", LAUNCHER_LINK, None))

        threading.Thread(target=read, name="sparktrain-mpi-link", daemon=True).start()
        return cls(client)

    def send(self, message: dict[str, Any]) -> None:
        """Best-effort message to the launcher."""
        if self.client is None:
            return
        try:
            self.client.send(message)
        except OSError:
            pass

    def close(self) -> None:
        """Close the connection."""
        if self.client is not None:
            self.client.close()
