"""The real driver against thousands of simulated tasks: rendezvous, result, stop, logs.

Everything on the driver's side is the real code: ``SparkRunner.run``'s attempt loop, the
run monitor, the channel, the layout checks, the interface vote, result delivery and teardown.
Only the Spark launch is replaced, by :class:`tests.fixtures.simtasks.SimLaunch`: N tasks on
N/8 simulated hosts (loopback addresses), many per helper process, each on its own TCP
connection speaking the real frames and messages. With 3 interfaces per host one of them is
dead (no probe reaches it).

For each N it prints:

* ``go``: seconds from the last task's hello to the last task holding ``go`` (target at
  2,048 tasks: at most 1 s), and the whole run's wall time;
* the driver's traffic (bytes sent and received, from the tasks' side);
* the driver's peak RSS growth and peak thread count during the run (target at 2,048 tasks:
  RSS at most 300 MB, threads not growing with N);
* ``stop``: seconds from one rank's failure to every task holding the abort, and to
  ``run()`` raising;
* log throughput: lines shown per second with every rank logging at a fixed rate, and the
  worst delay of a quiet rank's line while one rank floods (with what the flood got through).

All traffic stays on loopback. Hold the machine's lock when timing::

    flock /tmp/sparktrain-spark.lock python benchmarks/bench_scale.py [--sizes 16,128,512]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import threading
import time
from typing import Any

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparktrain import SparkRunner  # noqa: E402
from sparktrain.errors import SparkTrainError, WorkerFailedError  # noqa: E402
from tests.fixtures.simtasks import simulated  # noqa: E402

MB = 1 << 20


class Sink(io.TextIOBase):
    """The driver's stdout during a run: counts lines, and how late quiet ranks' lines are."""

    def __init__(self) -> None:
        self.lines = 0
        self.flood = 0
        self.notices = 0
        self.worst_delay = 0.0
        self.first: float | None = None
        self.last = 0.0

    def write(self, text: str) -> int:
        now = time.time()
        for line in text.splitlines():
            if not line.startswith("[rank "):
                continue
            self.lines += 1
            self.first = self.first or now
            self.last = now
            if " flood " in line:
                self.flood += 1
            elif "not shown" in line:
                self.notices += 1
            elif "t=" in line:
                stamp = line.split("t=", 1)[1].split(" ", 1)[0]
                with contextlib.suppress(ValueError):
                    self.worst_delay = max(self.worst_delay, now - float(stamp))
        return len(text)

    def writable(self) -> bool:
        return True


class Sampler:
    """The driver process's peak RSS and thread count while a run goes on."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.base_rss = self.proc.memory_info().rss
        self.peak_rss = self.base_rss
        self.peak_threads = threading.active_count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
            # Less this sampler's own thread.
            self.peak_threads = max(self.peak_threads, threading.active_count() - 1)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _noop() -> int:
    return 42


def run_case(n: int, helpers: int, timeout: float, **scenario: Any) -> dict[str, Any]:
    """One run of ``n`` simulated tasks; its figures."""
    sink = Sink()
    outcome = "ok"
    runner = SparkRunner(np=-n, start_timeout=timeout, stall_timeout=None, grace_period=5)
    scenario.setdefault("wait", timeout + 5)
    with simulated(n, helpers, **scenario) as launches, Sampler() as sampler:
        start = time.time()
        try:
            with contextlib.redirect_stdout(sink):
                value = runner.run(_noop)
            outcome = "ok" if value == {"ok": True, "value": 42} else f"wrong value {value!r}"
        except WorkerFailedError as exc:
            outcome = f"WorkerFailedError ({len(exc.failures)} rank)"
        except SparkTrainError as exc:
            outcome = f"{type(exc).__name__}: {str(exc).splitlines()[0][:40]}…"
        raised = time.time()
    if not launches:
        return {"n": n, "outcome": outcome}
    launch = launches[-1]
    launch.join()
    hello, go = launch.latest("hello"), launch.latest("go")
    failed, aborted = launch.latest("failed_at"), launch.latest("aborted")
    return {
        "n": n,
        "outcome": outcome,
        "wall": raised - start,
        "go": go - hello if go and hello else None,
        "sent": launch.total("received"),
        "received": launch.total("sent"),
        "rss": (sampler.peak_rss - sampler.base_rss) / MB,
        "peak_rss": sampler.peak_rss / MB,
        "threads": sampler.peak_threads,
        "stop_all": aborted - failed if aborted and failed else None,
        "stop_raised": raised - failed if failed else None,
        "lines": sink.lines,
        "rate": sink.lines / (sink.last - sink.first)
        if sink.first and sink.last > sink.first
        else 0,
        "delay": sink.worst_delay,
        "flood_shown": sink.flood,
        "flood_sent": launch.total("flood_lines"),
        "notices": sink.notices,
        "errors": launch.errors[:2],
    }


def _errors(r: dict[str, Any]) -> None:
    """Say what went wrong in the simulated tasks, if anything did (below the table)."""
    if r.get("errors"):
        print(f"  (N={r['n']}: simulated tasks failed: {'; '.join(r['errors'])[:300]})")


def _fmt(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    return format(value, spec) if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,128,512,2048,8192")
    parser.add_argument("--helpers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=300.0, help="start_timeout, seconds")
    parser.add_argument("--log-rate", type=float, default=2.0, help="lines/s of every rank")
    parser.add_argument("--log-seconds", type=float, default=3.0)
    parser.add_argument("--skip", default="", help="comma-separated: rendezvous,stop,log,flood")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    skip = set(args.skip.split(","))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; tasks on N/8 hosts\n")
    print("rendezvous and result (1 and 3 interfaces per host, one dead):")
    print(
        "| N | nics | outcome | go after last hello (s) | run (s) | driver sent (MB) | "
        "received (MB) | RSS growth (MB) | peak RSS (MB) | peak threads |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes if "rendezvous" not in skip else []:
        for nics in (1, 3):
            r = run_case(n, args.helpers, args.timeout, interfaces=nics)
            print(
                f"| {n} | {nics} | {r['outcome']} | {_fmt(r.get('go'))} | {_fmt(r.get('wall'))} | "
                f"{_fmt(r.get('sent', 0) / MB)} | {_fmt(r.get('received', 0) / MB)} | "
                f"{_fmt(r.get('rss'), '.0f')} | {_fmt(r.get('peak_rss'), '.0f')} | "
                f"{r.get('threads', '-')} |",
                flush=True,
            )
            _errors(r)
    print("\none rank fails once every rank has started:")
    print("| N | outcome | every task holds the abort (s) | run() raised (s) | peak threads |")
    print("|---|---|---|---|---|")
    for n in sizes if "stop" not in skip else []:
        r = run_case(n, args.helpers, args.timeout, mode="fail")
        print(
            f"| {n} | {r['outcome']} | {_fmt(r.get('stop_all'))} | {_fmt(r.get('stop_raised'))} "
            f"| {r.get('threads', '-')} |",
            flush=True,
        )
    print(
        f"\nlogs: every rank {args.log_rate:g} lines/s for {args.log_seconds:g} s; then the same "
        "with rank 1 flooding:"
    )
    print(
        "| N | case | outcome | lines shown | shown/s | worst delay of a quiet line (s) | "
        "flood lines sent | flood lines shown | drop notices | RSS growth (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        for mode in ("log", "flood"):
            if mode in skip:
                continue
            r = run_case(
                n,
                args.helpers,
                args.timeout,
                mode=mode,
                log_rate=args.log_rate,
                log_seconds=args.log_seconds,
            )
            print(
                f"| {n} | {mode} | {r['outcome']} | {r.get('lines', '-')} | "
                f"{_fmt(float(r.get('rate') or 0), '.0f')} | {_fmt(r.get('delay'))} | "
                f"{_fmt(r.get('flood_sent'), '.0f')} | {r.get('flood_shown', '-')} | "
                f"{r.get('notices', '-')} | {_fmt(r.get('rss'), '.0f')} |",
                flush=True,
            )
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
