"""What choosing the network interface adds to a launch, next to Horovod's own interface look-up.

Each task, on every launch, lists its interfaces, resolves its host's name and opens (later
closes) a probe listener; only when the ranks span hosts does it also probe the other tasks.
This measures, without Spark:

* ``one host``: those per-task steps, against Horovod's ``get_local_intfs()`` (what
  ``horovodrun`` calls for its interface list) measured in the same run;
* ``probe``: one host's prober probing 3 others at 2 interfaces each over loopback (every
  link answers: the cost of a working cluster), against the one-host steps. Every probe must
  reach all 3 tasks at both interfaces, or the benchmark stops with exit status 1.

Strangers at the probe port and the probes at width: ``benchmarks/bench_interface_choice.py``.

    python benchmarks/bench_probe.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from instruments import require

from sparktrain.layout.cluster import TaskInfo
from sparktrain.task.interface_probe import ProbeListener, probe
from sparktrain.task.netinfo import interface_addresses, name_address


def per_task() -> None:
    """What every task does for the interface choice, on any launch."""
    with ProbeListener(b"k" * 32, 0):
        interface_addresses()
        name_address()


def median_ms(call: Callable[[], object], repeats: int) -> float:
    call()  # imports, caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    key = b"k" * 32

    rows: list[tuple[str, float, str, float]] = []
    try:
        from horovod.runner.util.network import get_local_intfs

        peer = median_ms(get_local_intfs, args.repeats)
    except ImportError:
        peer = float("nan")
    ours = median_ms(per_task, args.repeats)
    rows.append(("one host: per-task steps", ours, "horovod get_local_intfs()", peer))

    listeners = [ProbeListener(key, i) for i in (1, 2, 3)]
    try:
        peers = [
            TaskInfo(
                index=lst_index,
                host=f"h{lst_index}",
                port=1,
                interfaces=(("eth0", ("127.0.0.1",)), ("ib0", ("127.0.0.1",))),
                probe_port=listener.port,
            )
            for lst_index, listener in zip((1, 2, 3), listeners, strict=True)
        ]
        expected = {"eth0": [1, 2, 3], "ib0": [1, 2, 3]}

        def probe_all() -> None:
            reached = {name: sorted(found) for name, found in probe(peers, key).items()}
            require(reached == expected, f"the probe reached {reached}, not {expected}")

        probed = median_ms(probe_all, args.repeats // 4 or 1)
    finally:
        for listener in listeners:
            listener.close()
    rows.append(("across hosts: probe 3 tasks x 2 nics", probed, "one host: per-task steps", ours))

    print(f"{'sparktrain':40} {'ms':>8}   {'measured against':28} {'ms':>8} {'ratio':>7}")
    for name, value, peer_name, peer_value in rows:
        ratio = value / peer_value if peer_value == peer_value and peer_value else float("nan")
        print(f"{name:40} {value:8.3f}   {peer_name:28} {peer_value:8.3f} {ratio:7.2f}")


if __name__ == "__main__":
    main()
