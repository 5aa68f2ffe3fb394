"""The driver's channel under a connection flood, during a live ``SparkRunner(np=-2)`` run.

Runs a training function of a few seconds (it reports every quarter second, so the channel is
in use) twice on the driver: once undisturbed, once while a separate attacker process, which
has no key, opens unauthenticated connections to the channel: ``--connections`` of them at
once, each holding a partial frame header, a header declaring a huge frame, or garbage, plus
``--slow`` connections that send one byte of a frame header every ``--interval`` seconds. All
traffic goes to 127.0.0.1; every loop is bounded in count and in time.

Prints, for both runs: whether the run returned the right value, its wall time, the driver's
resident memory and thread count (before, peak, after), what the channel rejected, and what
the attacker saw. Targets: RSS growth under 50 MB; threads bounded by a constant (the
channel's ``max_pending`` + ``max_connections`` + its acceptor), whatever the flood's size.

Both measured runs are warm (a first run, not measured, starts the driver's zygote); the table
says whether each run's rank 0 was forked, from the run's record. The wall-time ratio is
printed only when both runs returned the right value; otherwise the benchmark exits with
status 1 after the table (a run the flood made fail is a finding, not a time).

The churn case (``--case churn``) is a stranger that opens connections and closes them again
as fast as it can (``tests/fixtures/churn.py``, a process of its own, holding its newest 128),
started once the channel listens and before the tasks connect, for the whole run: ``--runs``
short runs under it and as many undisturbed ones, side by side, with how many returned the
right value and how many of their ranks' reports reached the driver.

    python benchmarks/bench_channel_flood.py [--case hold|churn|both] [--connections 1000]
        [--slow 200] [--seconds 5] [--runs 6] [--reports 20] [--churners 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
from instruments import rank0_forked, require

MAGIC = b"SPT1"  # sparktrain.wire.MAGIC: the attacker knows the format, not the key
HEADER = struct.Struct(">4sI")
MB = 1 << 20
RSS_TARGET_MB = 50
CONNECT_TIMEOUT = 2.0
CHURN = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "churn.py"


def train(seconds: float) -> str:
    """Report every quarter second for ``seconds``; return a value the driver can check."""
    import time

    import sparktrain

    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        sparktrain.report(step=step, loss=1.0 / (step + 1))
        step += 1
        time.sleep(0.25)
    return f"rank {sparktrain.rank()} of {sparktrain.world_size()}"


EXPECTED = "rank 0 of 2"


def report_steps(steps: int) -> str:
    """Report ``steps`` times, a twentieth of a second apart; return a value to check."""
    import time

    import sparktrain

    for step in range(steps):
        sparktrain.report(step=step, loss=1.0 / (step + 1))
        time.sleep(0.05)
    return f"rank {sparktrain.rank()} of {sparktrain.world_size()}"


# -- the attacker: a separate process, so the driver's memory and threads are its own ----------


def _opening(kind: int) -> bytes:
    """What unauthenticated connection number ``kind`` sends and then holds."""
    if kind % 3 == 0:
        return HEADER.pack(MAGIC, 64)[:6]  # a partial frame header
    if kind % 3 == 1:
        return HEADER.pack(MAGIC, 0xFFFFFFFF) + b"\0" * 64  # a huge declared length
    return bytes((kind * 7 + i) % 256 for i in range(256))  # garbage


def flood(address: str, connections: int, slow: int, interval: float, seconds: float) -> None:
    """Open the connections, hold them until the server drops them or ``seconds`` pass."""
    host, _, port_text = address.rpartition(":")
    target = (host.strip("[]"), int(port_text))
    sel = selectors.DefaultSelector()
    opened: dict[socket.socket, float] = {}
    trickle: dict[socket.socket, bytes] = {}
    dropped_after: list[float] = []
    failed = 0
    start = time.monotonic()
    deadline = start + seconds

    def open_one(first: bytes) -> socket.socket | None:
        nonlocal failed
        try:
            sock = socket.create_connection(target, timeout=CONNECT_TIMEOUT)
            if first:
                sock.sendall(first)
        except OSError:
            failed += 1
            return None
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        opened[sock] = time.monotonic()
        return sock

    def gone(sock: socket.socket) -> None:
        dropped_after.append(time.monotonic() - opened.pop(sock))
        trickle.pop(sock, None)
        sel.unregister(sock)
        sock.close()

    for i in range(connections):
        if time.monotonic() >= deadline:
            break
        open_one(_opening(i))
    frame = HEADER.pack(MAGIC, 200) + b"\0" * 232
    for _ in range(slow):
        if time.monotonic() >= deadline:
            break
        sock = open_one(b"")
        if sock is not None:
            trickle[sock] = frame
    opened_s = time.monotonic() - start
    next_tick = time.monotonic()
    while opened and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.0, min(next_tick, deadline) - time.monotonic())):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                if sock.recv(1 << 16):
                    continue  # the server's nonce
            except BlockingIOError:
                continue
            except OSError:
                pass
            gone(sock)
        if time.monotonic() >= next_tick:
            next_tick += interval
            for sock, rest in list(trickle.items()):
                try:
                    sock.send(rest[:1])
                    trickle[sock] = rest[1:] or frame
                except BlockingIOError:
                    continue
                except OSError:
                    gone(sock)
    still_open = len(opened)
    for sock in list(opened):
        sel.unregister(sock)
        sock.close()
    dropped_after.sort()
    print(
        json.dumps(
            {
                "attempted": connections + slow,
                "connect_failed": failed,
                "opened_s": opened_s,
                "dropped": len(dropped_after),
                "still_open": still_open,
                "median_drop_s": dropped_after[len(dropped_after) // 2] if dropped_after else None,
                "max_drop_s": dropped_after[-1] if dropped_after else None,
            }
        )
    )


# -- the driver ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Sample:
    """The driver process's memory and threads, at one moment and at their peaks."""

    rss: int
    threads: int

    @classmethod
    def now(cls) -> Sample:
        process = psutil.Process()
        return cls(process.memory_info().rss, process.num_threads())


class Sampler:
    """Samples the driver's RSS and thread count every ``period`` seconds, in a thread."""

    def __init__(self, period: float = 0.02) -> None:
        self.period = period
        self.peak = Sample.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            sample = Sample.now()
            self.peak = Sample(
                max(self.peak.rss, sample.rss), max(self.peak.threads, sample.threads)
            )

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclasses.dataclass
class Outcome:
    correct: bool
    forked: bool | None
    seconds: float
    before: Sample
    peak: Sample
    after: Sample
    reports: int = 0
    rejected: int | None = None
    limits: tuple[int, int] | None = None  # the channel's max_pending, max_connections
    attacker: dict[str, Any] | None = None


def run_once(args: argparse.Namespace, attack: bool) -> Outcome:
    """One run on the driver; with ``attack``, the flood starts as soon as the channel listens."""
    from sparktrain import SparkRunner

    runner = SparkRunner(np=-2, progress=False, start_timeout=60, timeout=120)
    servers: list[Any] = []
    attackers: list[subprocess.Popen[str]] = []

    def on_channel(server: Any) -> None:
        servers.append(server)
        if attack:
            command = [
                sys.executable,
                os.path.abspath(__file__),
                "--flood",
                server.address,
                "--connections",
                str(args.connections),
                "--slow",
                str(args.slow),
                "--interval",
                str(args.interval),
                "--flood-seconds",
                str(args.flood_seconds),
            ]
            attackers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))

    runner._channel_hook = on_channel
    before = Sample.now()
    with Sampler() as sampler:
        start = time.perf_counter()
        try:
            value = runner.run(train, args.seconds)
        except Exception as exc:  # noqa: BLE001 - a failed run is a result to print
            print(f"run failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            value = None
        seconds = time.perf_counter() - start
        attacker = None
        for child in attackers:
            out, _ = child.communicate(timeout=args.flood_seconds + 60)
            attacker = json.loads(out) if out.strip() else None
    after = Sample.now()
    server = servers[-1] if servers else None
    return Outcome(
        correct=value == EXPECTED,
        forked=rank0_forked(runner),
        seconds=seconds,
        reports=len(runner.history),
        before=before,
        peak=sampler.peak,
        after=after,
        rejected=server.rejected if server is not None else None,
        limits=(server.max_pending, server.max_connections) if server is not None else None,
        attacker=attacker,
    )


def _triple(a: float, b: float, c: float, fmt: str) -> str:
    return f"{a:{fmt}} / {b:{fmt}} / {c:{fmt}}"


def report(args: argparse.Namespace, quiet: Outcome, flooded: Outcome) -> None:
    rows: list[tuple[str, str, str]] = []

    def row(name: str, get: Any) -> None:
        rows.append((name, get(quiet), get(flooded)))

    row("run result correct", lambda o: "yes" if o.correct else "NO")
    row(
        "rank 0 forked from a zygote (warm)",
        lambda o: {None: "?", True: "yes", False: "no"}[o.forked],
    )
    row("wall time, s", lambda o: f"{o.seconds:.2f}")
    row("reports received from the ranks", lambda o: str(o.reports))
    row(
        "driver RSS MB before/peak/after",
        lambda o: _triple(o.before.rss / MB, o.peak.rss / MB, o.after.rss / MB, ".1f"),
    )
    row("RSS growth (peak - before), MB", lambda o: f"{(o.peak.rss - o.before.rss) / MB:.1f}")
    row(
        "driver threads before/peak/after",
        lambda o: _triple(o.before.threads, o.peak.threads, o.after.threads, "d"),
    )
    row("thread growth (peak - before)", lambda o: f"{o.peak.threads - o.before.threads:d}")
    row("rejected by the channel", lambda o: str(o.rejected))
    a = flooded.attacker or {}
    rows.append(("attacker: connections attempted", "-", str(a.get("attempted"))))
    rows.append(("attacker: connect failed", "-", str(a.get("connect_failed"))))
    opened = a.get("opened_s")
    rows.append(("attacker: s to open them all", "-", f"{opened:.2f}" if opened else "-"))
    rows.append(("attacker: dropped by the server", "-", str(a.get("dropped"))))
    rows.append(("attacker: still open at its end", "-", str(a.get("still_open"))))
    median, worst = a.get("median_drop_s"), a.get("max_drop_s")
    rows.append(
        (
            "attacker: s to be dropped, median/max",
            "-",
            f"{median:.2f} / {worst:.2f}" if median is not None else "-",
        )
    )
    width = max(len(r[0]) for r in rows)
    print()
    print(
        f"driver channel flood: {args.connections} unauthenticated connections (partial header "
        f"/ huge length / garbage) + {args.slow} slow senders (1 byte / {args.interval:g} s), "
        f"127.0.0.1; SparkRunner(np=-2), {args.seconds:g} s training function"
    )
    header = f"{'':<{width}}  {'no flood':>22}  {'flood':>22}"
    print(header)
    print("-" * len(header))
    for name, q, f in rows:
        print(f"{name:<{width}}  {q:>22}  {f:>22}")
    growth = (flooded.peak.rss - flooded.before.rss) / MB
    extra = flooded.peak.threads - flooded.before.threads
    print()
    print(f"RSS growth under flood: {growth:.1f} MB (target < {RSS_TARGET_MB} MB)")
    if flooded.limits is not None:
        pending, conns = flooded.limits
        bound = pending + conns + 1
        print(
            f"thread growth under flood: {extra} (bound: max_pending {pending} + "
            f"max_connections {conns} + acceptor = {bound}, whatever the flood's size)"
        )
    require(
        quiet.correct and flooded.correct,
        "a run did not return the right value: no wall-time ratio "
        f"(no flood: {'right' if quiet.correct else 'WRONG'}, flood: "
        f"{'right' if flooded.correct else 'WRONG'})",
    )
    print(f"wall time ratio flood / no flood: {flooded.seconds / quiet.seconds:.2f}")


@dataclasses.dataclass
class ChurnRun:
    """One short run, with or without a churning stranger at its channel."""

    correct: bool
    reports: int
    seconds: float
    error: str = ""
    ended: int = 0  # connections that ended at the channel without authenticating


def churn_once(args: argparse.Namespace, churn: bool) -> ChurnRun:
    """One run of :func:`report_steps`; with ``churn``, the stranger starts once the channel
    listens (before the local supervisor connects) and churns until the run has ended."""
    from sparktrain import SparkRunner

    runner = SparkRunner(np=-2, progress=False, start_timeout=60, timeout=120)
    servers: list[Any] = []
    strangers: list[subprocess.Popen[str]] = []

    def on_channel(server: Any) -> None:
        servers.append(server)
        if churn:
            host, _, port = server.address.rpartition(":")
            command = [sys.executable, str(CHURN), host, port, "--seconds", "120"]
            for _ in range(args.churners):
                child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
                strangers.append(child)
                assert child.stdout is not None
                child.stdout.readline()  # "churning": the flood is on

    runner._channel_hook = on_channel
    error = ""
    start = time.perf_counter()
    try:
        value = runner.run(report_steps, args.reports)
    except Exception as exc:  # noqa: BLE001 - a failed run is a result to count
        value, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    seconds = time.perf_counter() - start
    for child in strangers:
        child.terminate()
        child.wait(30)
    server = servers[-1] if servers else None
    ended = server.rejected + getattr(server, "abandoned", 0) if server is not None else 0
    return ChurnRun(value == EXPECTED, len(runner.history), seconds, error, ended)


def churn_report(args: argparse.Namespace, quiet: list[ChurnRun], churned: list[ChurnRun]) -> None:
    expected = 2 * args.reports
    rows: list[tuple[str, str, str]] = []

    def row(name: str, get: Any) -> None:
        rows.append((name, get(quiet), get(churned)))

    row("runs that returned the right value", lambda r: f"{sum(x.correct for x in r)} / {len(r)}")
    row(
        "reports received, all runs",
        lambda r: f"{sum(x.reports for x in r)} / {expected * len(r)}",
    )
    row(
        "runs with every report",
        lambda r: f"{sum(x.reports == expected for x in r)} / {len(r)}",
    )
    row("wall time per run, median s", lambda r: f"{statistics.median(x.seconds for x in r):.2f}")
    row("wall time per run, max s", lambda r: f"{max(x.seconds for x in r):.2f}")
    row(
        "keyless connections ended at the channel, median",
        lambda r: f"{statistics.median(x.ended for x in r):.0f}",
    )
    width = max(len(r[0]) for r in rows)
    print()
    print(
        f"driver channel under a connection churn: {args.churners} stranger process(es) opening "
        f"and closing connections as fast as they can (each holding its newest 128), 127.0.0.1, "
        f"from before the tasks connect; "
        f"SparkRunner(np=-2), {args.runs} runs each, {args.reports} reports per rank"
    )
    header = f"{'':<{width}}  {'no churn':>12}  {'churn':>12}"
    print(header)
    print("-" * len(header))
    for name, q, c in rows:
        print(f"{name:<{width}}  {q:>12}  {c:>12}")
    for run in quiet + churned:
        if run.error:
            print(f"  a run failed: {run.error}")
    print(
        "wall time ratio churn / no churn (medians): "
        f"{statistics.median(x.seconds for x in churned) / statistics.median(x.seconds for x in quiet):.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1000, help="unauthenticated, at once")
    parser.add_argument("--slow", type=int, default=200, help="slow senders")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between slow bytes")
    parser.add_argument("--seconds", type=float, default=10.0, help="training function's length")
    parser.add_argument(
        "--flood-seconds", type=float, default=20.0, help="longest the attacker holds on"
    )
    parser.add_argument("--case", choices=("hold", "churn", "both"), default="both")
    parser.add_argument("--runs", type=int, default=6, help="runs per side, churn case")
    parser.add_argument("--reports", type=int, default=20, help="reports per rank, churn case")
    parser.add_argument("--churners", type=int, default=1, help="stranger processes, churn case")
    parser.add_argument("--flood", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.flood:
        flood(args.flood, args.connections, args.slow, args.interval, args.flood_seconds)
        return
    run_once(args, attack=False)  # warm-up: imports and first-run costs
    if args.case in ("churn", "both"):
        # Interleaved, so that the machine's load falls on both sides alike.
        pairs = [(churn_once(args, False), churn_once(args, True)) for _ in range(args.runs)]
        churn_report(args, [q for q, _ in pairs], [c for _, c in pairs])
    if args.case in ("hold", "both"):
        quiet = run_once(args, attack=False)
        flooded = run_once(args, attack=True)
        report(args, quiet, flooded)


if __name__ == "__main__":
    main()
