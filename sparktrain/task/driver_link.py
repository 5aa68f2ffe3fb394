"""A task's session: its link to the driver, its events, and what every rank process gets.

Whoever creates the rank processes (:mod:`sparktrain.task.rank_launchers`) works through this:
it sends to the driver, waits on :attr:`TaskSession.events` (exits of its processes, the
driver's abort, and the peers of an MPI run) and builds each process's environment from
:meth:`TaskSession.common_env`.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparktrain import contract, private_dir, wire
from sparktrain.backends.base import attempt_env
from sparktrain.layout.cluster import RankSpec
from sparktrain.layout.rendezvous import GoAssembler
from sparktrain.task import workdirs
from sparktrain.task.assignment import TaskJob
from sparktrain.task.logs import LogForwarder, RankFiles, log_folder
from sparktrain.task.stream_feed import NO_STREAM
from sparktrain.task.zygotes import zygote_for
from sparktrain.wire import protocol

# One event: (kind, id, value). Kinds: "exit" (process key, exit code), "abort" (-1, reason),
# "stacks" (-1, reason: the driver asks where every rank is), "peer" (connection id, message)
# and "peer_closed" (connection id, None).
Event = tuple[str, int, Any]
# Most seconds between two "active" messages, when output is not forwarded (the driver's
# stall watch needs to know that ranks print).
ACTIVE_INTERVAL = 10.0


class TaskSession:
    """One task's (or the local supervisor's) link to the driver and its event queue.

    Args:
        job: what the task was handed.
        client: its connection to the driver's channel; ``None`` when the driver could not
            be reached (the driver then counts the task as missing, and it starts no rank).
    """

    def __init__(self, job: TaskJob, client: wire.ChannelClient | None) -> None:
        self.job = job
        self.config = job.run_config
        self.client = client
        self.events: queue.Queue[Event] = queue.Queue()
        self.forward_logs = self.config.driver_log_verbosity == "all"
        # Whether this is a Spark task in an executor's Python worker (not the driver's local
        # supervisor): its warm zygote then serves the executor's later workers too.
        self.in_executor = False
        # A run given a DataFrame: what each rank's environment gets to find its task's
        # stream (see task.stream_feed).
        self.stream = NO_STREAM
        # Every line of every rank, when log_dir is set; a bounded share of them to the driver.
        self.files = RankFiles(log_folder(job))
        self.forwarder = (
            LogForwarder(self.send, self.files.where)
            if self.forward_logs and client is not None
            else None
        )
        stall = self.config.stall_timeout
        self._active_interval = min(ACTIVE_INTERVAL, stall / 4) if stall else None
        self._last_active = -math.inf
        # Set with the "abort" event, so a launcher can skip starting ranks it must stop.
        self.aborted = threading.Event()
        # Set when the driver says every task has arrived (see wait_for_go), and when it
        # hands out what rank 0's task prepared (see exchange); also set on abort.
        self._go = threading.Event()
        self._shared = threading.Event()
        self._go_message: dict[str, Any] | None = None
        # When the driver's "go" arrived (wall clock); the local supervisor has none to wait for.
        self.go_time: float | None = None
        # Set when the driver names the interface the ranks talk over (see wait_for_interface).
        self._chosen = threading.Event()
        self._ifname: str | None = None
        self._shared_values: dict[str, str] = {}
        # Set with the driver's answer to a result sent over the channel (or its loss).
        self._saved = threading.Event()
        self._saved_answer: dict[str, Any] | None = None
        # Ranks start where the task runs, as a function run by the task itself would; the
        # run's own files live in workdir(). The SparkFiles root, when the task knows one.
        self.cwd = os.getcwd()
        self.spark_files: str | None = None
        # The environments (and folders) of cold ranks whose zygotes start at finish().
        self._warm: list[tuple[dict[str, str], str]] = []
        self._finished = False
        # Whether a thread reads the driver's messages (listen), and whether it has ended;
        # under the lock, the one of it and _release that comes last closes the connection.
        self._reading = False
        self._read_ended = False
        self._link_lock = threading.Lock()

    # -- the driver -----------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        """Best-effort message to the driver."""
        if self.client is None:
            return
        try:
            self.client.send(message)
        except (OSError, wire.FrameError):
            pass

    def started(self, rank: RankSpec, pid: int) -> None:
        """Tell the driver which process runs ``rank`` (mpirun, for all ranks of an MPI run)."""
        self.send(
            protocol.STARTED(rank=rank.rank, pid=pid, host=rank.task.host, index=rank.task.index)
        )

    def log(self, rank: int, line: str) -> None:
        """One line of a rank's output (from its pump thread; never waits on the driver).

        It goes whole to the rank's file under ``log_dir`` (when set), and to the driver when
        the run's verbosity asks for it, within the rank's budget (see
        :mod:`sparktrain.task.logs`); else the driver hears now and then that ranks print
        (for its stall watch).
        """
        self.files.write(rank, line)
        if self.forwarder is not None:
            self.forwarder.line(rank, line)
        elif self._active_interval is not None and self.client is not None:
            now = time.monotonic()
            if now - self._last_active >= self._active_interval:
                self._last_active = now
                self.send(protocol.ACTIVE(rank=rank))

    def close_logs(self) -> None:
        """Send the lines still queued for the driver (waiting a few seconds at most) and
        close the ranks' files; idempotent."""
        if self.forwarder is not None:
            self.forwarder.close()
        self.files.close()

    def warm_later(self, env: dict[str, str], cwd: str) -> None:
        """Have a zygote for ranks with ``env`` in ``cwd`` load once the driver has this
        task's output (see :meth:`finish`): a later run's ranks are forked from it."""
        self._warm.append((env, cwd))

    def finish(self) -> None:
        """End the link to the driver (idempotent); called once the task's ranks are done
        and the driver was told.

        The zygotes asked for by :meth:`warm_later` start now and wait to load until the
        driver has the task's output: each holds this task's connection, which the driver
        closes then (after the job's end), so loading them does not slow that end.
        """
        if self._finished:
            return
        self._finished = True
        kept, self._warm = self._warm, []
        hold = self._hold() if kept else None
        try:
            for env, cwd in kept:
                zygote_for(env, cwd, shared=self.in_executor, hold=hold)
        finally:
            self._release(held=hold is not None)

    def _hold(self) -> int | None:
        """What this task's zygotes wait to see end before they load: its connection."""
        client = self.client
        return None if client is None or client.closed else client.fileno()

    def _release(self, held: bool) -> None:
        """Close the connection; when a zygote holds it, close this process's descriptor
        alone, and only once no thread of this process reads it any more (a descriptor
        closed under a blocked reader may be reused by the next one opened, and read)."""
        client = self.client
        if client is None:
            return
        if not held:
            client.close()
            return
        with self._link_lock:
            client.stop()
            if not self._reading or self._read_ended:
                client.close(shut=False)

    def listen(self) -> None:
        """Turn the driver's abort (or its disappearance) into an abort event."""
        if self.client is None:
            return
        client = self.client
        assembler = GoAssembler()
        self._reading = True

        def read() -> None:
            try:
                listen_to(client)
            finally:
                with self._link_lock:
                    self._read_ended = True
                    if client.closed:  # stopped by _release: the descriptor is this one's
                        client.close(shut=False)

        def listen_to(client: wire.ChannelClient) -> None:
            try:
                while True:
                    message = client.receive()
                    kind = protocol.parse(message, protocol.TO_TASK)
                    if kind in (protocol.LAYOUT, protocol.GO) and assembler.add(message):
                        self._go_message = assembler.go
                        self.go_time = time.time()
                        self._go.set()
                    elif kind is protocol.SHARED:
                        self._shared_values = dict(message["values"])
                        self._shared.set()
                    elif kind is protocol.CHOSEN:
                        self._ifname = str(message["ifname"])
                        self._chosen.set()
                    elif kind is protocol.SHOW_STACKS:
                        self.events.put(("stacks", -1, message["reason"]))
                    elif kind is protocol.RESULT_SAVED:
                        self._saved_answer = message
                        self._saved.set()
                    elif kind is protocol.ABORT:
                        abort(message["reason"])
            except (OSError, EOFError, wire.FrameError):
                if client.closed:
                    return
            # The connection ended: no answer to a result sent will come any more.
            self._saved.set()
            abort("the driver closed the connection")

        def abort(reason: str) -> None:
            # Once: the first word of a stop is the one the ranks hear. Reading goes on after
            # it: a result on its way is still answered (the driver collects results while it
            # waits for the tasks to confirm their end).
            if self.aborted.is_set():
                return
            self.aborted.set()
            self._go.set()
            self._chosen.set()
            self._shared.set()
            self.events.put(("abort", -1, reason))

        threading.Thread(target=read, name="sparktrain-abort-listener", daemon=True).start()

    def wait_for_go(self) -> dict[str, Any] | None:
        """Block until the driver lets the ranks start: this task's part of the layout.

        The driver says "go" once every task has arrived, with what this task needs of the
        layout (see :mod:`sparktrain.layout.rendezvous`; :func:`~sparktrain.layout.rendezvous.view_of`
        reads it), so the tasks need no barrier of Spark's to learn it, and until then the
        driver knows no rank can have started and may end the job at once.

        Returns:
            The ``go`` message (with the ``layout`` messages before it joined in), or None
            when the run was stopped instead.
        """
        if self.client is None:
            return None  # the driver never heard of this task: it counts it as missing
        self._go.wait(self.config.start_timeout + self.config.grace_period)
        if not self._go.is_set() or self.aborted.is_set():
            return None
        return self._go_message

    def wait_for_interface(self) -> str | None:
        """Block until the driver names the network interface every rank talks over (after
        every task's probes, see :mod:`sparktrain.task.interface_probe`).

        Returns:
            Its name, or None when the run was stopped instead.
        """
        self._chosen.wait(self.config.start_timeout + self.config.grace_period)
        if not self._chosen.is_set() or self.aborted.is_set():
            return None
        return self._ifname

    def exchange(self, values: dict[str, str] | None) -> dict[str, str] | None:
        """Hand what rank 0's task prepared to every task, through the driver.

        Args:
            values: what this task prepared, on the task of rank 0; None on the others.

        Returns:
            Rank 0's task's values, or None when the run was stopped first.
        """
        if values is not None:
            self.send(protocol.SHARED(values=values))
        self._shared.wait(self.config.start_timeout + self.config.grace_period)
        if not self._shared.is_set() or self.aborted.is_set():
            return None
        return self._shared_values

    def result_saved(self, timeout: float) -> str | None:
        """Wait for the driver's answer to a result sent over the channel.

        Returns:
            None when the driver holds the result, else why it does not.
        """
        if not self._saved.wait(timeout):
            return f"the driver did not confirm it within {timeout:.0f}s"
        # Taken, so that a task sending several ranks' results waits for each one's answer
        # (one at a time); a connection that ended leaves the event set and no answer.
        answer, self._saved_answer = self._saved_answer, None
        if answer is not None:
            self._saved.clear()
        if answer is None:
            return "the connection to the driver ended before it confirmed it"
        return None if answer["ok"] else str(answer["error"])

    # -- what every worker process gets -----------------------------------------------------

    @contextlib.contextmanager
    def workdir(self) -> Iterator[Path]:
        """A fresh folder holding the payload, where the ranks leave their outcome files.

        It is not the ranks' working directory (that is :attr:`cwd`), and it is removed
        however the ranks end.
        """
        with workdirs.create(self.job.run_id, kept_ttl=self.config.kept_results_ttl) as path:
            fd = os.open(path / contract.PAYLOAD_FILE, private_dir.EXCLUSIVE, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(self.job.payload)
            yield path

    def common_env(self, workdir: Path) -> dict[str, str]:
        """What every worker process of this task gets, whatever its rank."""
        paths = [p for p in sys.path if p and os.path.exists(p)]
        return {
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(paths),
            contract.RUN_ID_ENV: self.job.run_id,
            contract.ATTEMPT_ENV: str(self.job.attempt),
            **self.elastic_env(),
            **attempt_env(self.job.run_id, self.job.attempt),
            contract.GRACE_ENV: str(self.config.grace_period),
            contract.START_TIMEOUT_ENV: str(self.config.start_timeout),
            contract.CHANNEL_ENV: self.job.channel,
            contract.KEY_ENV: self.job.key.hex(),
            contract.PAYLOAD_ENV: str(workdir / contract.PAYLOAD_FILE),
            contract.MAX_RESULT_ENV: str(self.config.max_result_bytes),
            contract.TASK_CWD_ENV: self.cwd,
            **({contract.SPARK_FILES_ENV: self.spark_files} if self.spark_files else {}),
        }

    def elastic_env(self) -> dict[str, str]:
        """An elastic run's variables (see ``contract.ELASTIC_ENV``); none for a fixed size."""
        if self.config.elastic is None:
            return {}
        previous = self.job.previous_world_size or self.config.world_size
        return {
            contract.ELASTIC_ENV: "1",
            contract.PREVIOUS_WORLD_SIZE_ENV: str(previous),
        }

    def on_exit(self, key: int, code: int) -> None:
        """A process's exit, as an event for the loop that waits on them."""
        self.events.put(("exit", key, code))
