"""The interface choice with strangers at every probe port, and the probes it takes at width.

Hosts are loopback addresses (127.x.y.z, all on this machine; nothing else is ever sent
to). Each host has three interfaces: ``eth0`` and ``ib0`` answer, ``decoy`` is dead (its
address takes the connection and never answers, as a link whose peer is gone; so each dead
link costs the probe timeout). Each host's prober (:mod:`sparktrain.layout.rendezvous`) probes the
hosts it is given with the real :func:`~sparktrain.task.interface_probe.probe` against real
:class:`~sparktrain.task.interface_probe.ProbeListener`\\ s, and the driver's
:class:`~sparktrain.driver.layout.InterfaceVote` chooses.

1. ``strangers``: a 2-host run of 2 tasks per host, every task listening; the interface
   choice (each prober's probes, then the vote) without strangers, then with 50 idle
   connections and 50 slow senders (a byte every 0.2 s, reopened as soon as dropped) at
   every task's probe port: its time, and the growth (target: under 1 s).
2. ``width``: N = 16, 128, 2,048 tasks on N/8 hosts: probes per prober and in all, against
   what every task probing every task of every other host made (the design before), the
   choice, and the time of the slowest prober (probers run 32 at a time here, each with its
   own probes in parallel; on a cluster every host runs its own at once).

    python benchmarks/bench_interface_choice.py [--timeout 2.0] [--widths 16,128,2048]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparktrain.driver.layout import InterfaceVote  # noqa: E402
from sparktrain.layout.cluster import TaskInfo  # noqa: E402
from sparktrain.layout.rendezvous import go_messages, plan, view_of  # noqa: E402
from sparktrain.task.interface_probe import ProbeListener, probe  # noqa: E402
from tests.fixtures.strangers import Strangers  # noqa: E402

KEY = os.urandom(32)
TASKS_PER_HOST = 8


class Host:
    """One simulated host: its prober's probe listener and its dead decoy address.

    Only a host's prober is probed, so its other tasks share its listener here (on a
    cluster each task listens; the others are never asked).
    """

    def __init__(self, node: int, first_index: int, tasks: int) -> None:
        self.eth0 = f"127.10.{node // 250}.{node % 250 + 1}"
        self.ib0 = f"127.11.{node // 250}.{node % 250 + 1}"
        self.decoy = f"127.12.{node // 250}.{node % 250 + 1}"
        self.listeners = [ProbeListener(KEY, first_index, [self.eth0, self.ib0])]
        port = self.listeners[0].port
        # The decoy takes connections at the listener's port and never answers.
        self.dead = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.dead.bind((self.decoy, port))
        self.dead.listen(1024)
        self.infos = [
            TaskInfo(
                index=first_index + i,
                host=self.eth0,
                port=0,
                ifname="eth0",
                interfaces=(("decoy", (self.decoy,)), ("eth0", (self.eth0,)), ("ib0", (self.ib0,))),
                probe_port=port,
            )
            for i in range(tasks)
        ]

    def close(self) -> None:
        for listener in self.listeners:
            listener.close()
        self.dead.close()


def choose(hosts: list[Host], timeout: float, parallel: int) -> tuple[str, float, list[int], float]:
    """The interface choice over ``hosts``: (choice, seconds, probes per prober, slowest)."""
    tasks = [info for host in hosts for info in host.infos]
    start = time.monotonic()
    layout = plan(tasks)
    vote = InterfaceVote(layout, None)
    views = {p: view_of(go_messages(layout, [p])[-1]) for p in layout.probers}

    def run(prober: int) -> tuple[int, dict[str, list[int]], int, float]:
        began = time.monotonic()
        targets = views[prober].probe
        reached = probe(targets, KEY, timeout=timeout)
        links = sum(len(t.interfaces) for t in targets)
        return prober, reached, links, time.monotonic() - began

    answer = None
    counts, took = [], []
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for prober, reached, links, seconds in pool.map(run, layout.probers):
            counts.append(links)
            took.append(seconds)
            answer = vote.add(prober, reached) or answer
    elapsed = time.monotonic() - start
    name = str(answer[0] if answer and answer[0] else f"none: {answer and answer[1]}")
    return name, elapsed, counts, max(took)


def strangers_table(timeout: float, repeats: int) -> None:
    hosts = [Host(node, node * 2, 2) for node in range(2)]
    # Every task listens: the second task of each host has a listener of its own too.
    for host in hosts:
        host.listeners.append(ProbeListener(KEY, host.infos[1].index, [host.eth0, host.ib0]))
    try:
        quiet = [choose(hosts, timeout, 2) for _ in range(repeats)]
        crowds = [
            Strangers(host.eth0, listener.port, idle=50, slow=50)
            for host in hosts
            for listener in host.listeners
        ]
        try:
            time.sleep(0.5)  # let them settle in: the listeners are crowded from here on
            crowded = [choose(hosts, timeout, 2) for _ in range(repeats)]
            opened = sum(c.opened for c in crowds)
            dropped = sum(listener.dropped for h in hosts for listener in h.listeners)
        finally:
            for crowd in crowds:
                crowd.stop()
    finally:
        for host in hosts:
            host.close()
    base = statistics.median(r[1] for r in quiet)
    busy = statistics.median(r[1] for r in crowded)
    print("2 hosts x 2 tasks, 3 interfaces (decoy dead), probe timeout", f"{timeout:g} s")
    print(f"{'case':34} {'choice':8} {'median s':>9} {'max s':>7}")
    print(f"{'no strangers':34} {quiet[0][0]:8} {base:9.3f} {max(r[1] for r in quiet):7.3f}")
    print(
        f"{'50 idle + 50 slow at every port':34} {crowded[0][0]:8} {busy:9.3f} "
        f"{max(r[1] for r in crowded):7.3f}"
    )
    print(
        f"growth with strangers: {busy - base:+.3f} s (target < 1 s); ratio {busy / base:.2f}; "
        f"stranger connections opened {opened}, dropped by the listeners {dropped}"
    )


def width_table(widths: list[int], timeout: float) -> None:
    print()
    print(f"probes at width (8 tasks per host, 3 interfaces, decoy dead; timeout {timeout:g} s)")
    header = (
        f"{'tasks':>6} {'hosts':>6} {'per prober':>10} {'in all':>8} {'before':>10} "
        f"{'ratio':>7} {'choice':7} {'slowest s':>9} {'all s':>7}"
    )
    print(header)
    for n in widths:
        count = n // TASKS_PER_HOST
        hosts = []
        try:
            for node in range(count):
                hosts.append(Host(node, node * TASKS_PER_HOST, TASKS_PER_HOST))
            name, elapsed, counts, slowest = choose(hosts, timeout, parallel=32)
        finally:
            for host in hosts:
                host.close()
        total = sum(counts)
        # Before: every task probed every task on every other host at each of 3 interfaces.
        before = n * (n - TASKS_PER_HOST) * 3
        print(
            f"{n:>6} {count:>6} {statistics.median(counts):>10.0f} {total:>8} {before:>10} "
            f"{total / before:>7.4f} {name:7} {slowest:>9.2f} {elapsed:>7.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--widths", default="16,128,2048")
    args = parser.parse_args()
    strangers_table(args.timeout, args.repeats)
    width_table([int(w) for w in args.widths.split(",")], args.timeout)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
