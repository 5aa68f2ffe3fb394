"""Which network interface the ranks talk over: one name common to every host, that reaches
every other host (pure functions of what the tasks reported and probed).

Each task reports its interfaces (name → IPv4 addresses) at rendezvous and listens for
probes. When the ranks span hosts, one task per host (its prober) connects to the prober of
each host it is given (every other host, or a sample: :func:`sparktrain.layout.rendezvous.
probe_targets`) at that task's address on each of its interfaces; the peer proves who it is
(an HMAC of the run's key), so the same address on two hosts (a Docker bridge) never passes
for a link. The driver gathers what each prober reached and picks with
:func:`choose_interface`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from sparktrain.layout.cluster import ClusterSpec, RankSpec, TaskInfo

# What one task reached: interface name -> indices of the tasks reached at their address on it.
Reached = Mapping[str, Sequence[int]]


def _where(task: TaskInfo) -> str:
    names = ", ".join(f"{name} ({', '.join(addrs)})" for name, addrs in task.interfaces)
    return f"{task.host}: {names or 'no interface with an IPv4 address'}"


def describe_hosts(tasks: Sequence[TaskInfo]) -> str:
    """Each host's interfaces with their addresses, one host per line."""
    seen: dict[str, str] = {}
    for task in tasks:
        seen.setdefault(task.host, _where(task))
    return "\n".join(f"  {line}" for line in seen.values())


def missing_nics(tasks: Sequence[TaskInfo], nics: Sequence[str]) -> str | None:
    """Why the ``nics`` setting cannot be met, or None: a host has none of its interfaces.

    Interfaces are only known where tasks reported them; tasks that reported none (an older
    sparktrain) are not judged.
    """
    for task in tasks:
        if task.interfaces and not any(task.addresses_of(name) for name in nics):
            return (
                f"nics={list(nics)}: host {task.host} has no such interface with an IPv4 "
                f"address. The hosts have:\n{describe_hosts(tasks)}\nSet nics (argument "
                "nics=, or spark.sparktrain.nics) to interfaces every host has, or leave it "
                "unset to let sparktrain probe for one"
            )
    return None


# The failed links an error message lists per interface, at most (then how many more).
SHOWN_LINKS = 12


def _unreached(
    hosts: Sequence[TaskInfo],
    reached: Mapping[int, Reached],
    name: str,
    targets: Mapping[int, Sequence[int]],
) -> list[str]:
    """The links that failed on interface ``name``: 'A -> B (address)' for each."""
    failed = []
    for position, src in enumerate(hosts):
        got = set(reached.get(src.index, {}).get(name, ()))
        for other in targets.get(position, ()):
            dst = hosts[other]
            if dst.host == src.host or dst.index in got:
                continue
            addrs = dst.addresses_of(name)
            target = f"{dst.host}'s {name} ({', '.join(addrs)})" if addrs else f"{dst.host}"
            failed.append(f"{src.host} could not reach {target}")
    return sorted(set(failed))


def _shown(failed: Sequence[str]) -> str:
    more = len(failed) - SHOWN_LINKS
    return "; ".join(failed[:SHOWN_LINKS]) + (f"; and {more} more" if more > 0 else "")


def candidates(tasks: Sequence[TaskInfo], nics: Sequence[str] | None) -> list[str]:
    """Interface names to try, in order: ``nics`` as given; else the names every host has,
    the one that holds the executors' address first, then by name."""
    if nics:
        return list(nics)
    common = set.intersection(*(set(dict(t.interfaces)) for t in tasks)) if tasks else set()
    spark_names = {t.ifname for t in tasks}
    first = [n for n in spark_names if n in common] if len(spark_names) == 1 else []
    return first + sorted(common - set(first))


def choose_interface(
    hosts: Sequence[TaskInfo],
    reached: Mapping[int, Reached],
    nics: Sequence[str] | None,
    targets: Mapping[int, Sequence[int]] | None = None,
) -> tuple[str | None, str | None]:
    """The interface on which every host's prober reached every host it probed.

    Args:
        hosts: each host's prober (the task that probes for its host), in node order.
        reached: by prober index, what its probes reached (see :data:`Reached`).
        nics: the user's interfaces, in order of preference; None to choose among all.
        targets: by position in ``hosts``, the positions of the hosts it probed
            (:func:`sparktrain.layout.rendezvous.probe_targets`); default: every other host.

    Returns:
        ``(name, None)``, or ``(None, why)`` naming each host's interfaces and what failed.
    """
    if targets is None:
        targets = {i: [j for j in range(len(hosts)) if j != i] for i in range(len(hosts))}
    tried = []
    for name in candidates(hosts, nics):
        failed = _unreached(hosts, reached, name, targets)
        if not failed:
            return name, None
        tried.append(f"  {name}: " + _shown(failed))
    what = f"none of nics={list(nics)}" if nics else "no network interface common to all hosts"
    return None, (
        f"{what} reaches every other host, so the ranks could not connect. The hosts have:\n"
        f"{describe_hosts(hosts)}\nTried:\n" + ("\n".join(tried) or "  (nothing to try)") + "\n"
        "Set nics (argument nics=, or spark.sparktrain.nics) to an interface on a network "
        "that joins the hosts, or fix the hosts' routes or firewall"
    )


def with_interface(spec: ClusterSpec, name: str) -> ClusterSpec:
    """``spec`` with every task on interface ``name``, and the master's address on it."""

    def on(rank: RankSpec) -> RankSpec:
        return dataclasses.replace(rank, task=dataclasses.replace(rank.task, ifname=name))

    first = on(spec.first)
    addrs = first.task.addresses_of(name)
    master = addrs[0] if addrs and spec.master_addr not in addrs else spec.master_addr
    ranks = tuple(on(rank) for rank in spec.ranks)
    return dataclasses.replace(spec, ranks=ranks, first=first, master_addr=master)
