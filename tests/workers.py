"""The suite on two pytest-xdist workers (``./dev test`` passes ``-n 2``): what each may run.

The tiers that start a Spark application of their own in the test process (cluster, then
connect, whose client cannot follow a classic session in one process) stay together, in that
order, on the first worker, which is also the one that claims the cluster tier's hosts. The
unit and gpu tiers are one unit of work for the other worker. Each module of the spark tier is a
unit of work of its own (its module fixtures stay in one process), the slowest modules first,
for whichever worker is free: each worker that runs one starts its own shared session.

Its hooks are loaded by ``tests/conftest.py`` only where pytest-xdist is installed.
"""

from __future__ import annotations

import os

import pytest

from tests.tier_times import tier_of

FIRST_WORKER = "gw0"
SESSION_TIERS = "cluster+connect"  # one unit of work, on FIRST_WORKER
IN_PROCESS_TIERS = "unit+gpu"


def claims_cluster_hosts() -> bool:
    """Whether this process may run the cluster tier (so claims its hosts at collection)."""
    return os.environ.get("PYTEST_XDIST_WORKER", FIRST_WORKER) == FIRST_WORKER


def unit_of_work(nodeid: str) -> str:
    """The unit of work a test belongs to: one worker runs a unit's tests in order."""
    tier = tier_of(nodeid)
    if tier in ("cluster", "connect"):
        return SESSION_TIERS
    if tier == "spark":
        return nodeid.split("::", 1)[0]
    return IN_PROCESS_TIERS


def _scheduling(config: pytest.Config, log):  # noqa: ANN001, ANN202 (xdist's types)
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with :func:`unit_of_work` as the scope, and the session
        tiers given to :data:`FIRST_WORKER` alone."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

        def _assign_work_unit(self, node) -> None:  # noqa: ANN001 (xdist's WorkerController)
            if node.gateway.id == FIRST_WORKER and SESSION_TIERS in self.workqueue:
                self.workqueue.move_to_end(SESSION_TIERS, last=False)
            elif next(iter(self.workqueue)) == SESSION_TIERS and len(self.workqueue) > 1:
                self.workqueue.move_to_end(SESSION_TIERS)  # left for the first worker
            super()._assign_work_unit(node)

    return TierScheduling(config, log)


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201
    """Any distribution of the suite by load (``-n N``, with or without ``--dist load`` or
    ``loadscope``) is this one: the suite cannot run test by test on any worker."""
    if config.getvalue("dist") not in ("load", "loadscope"):
        return None
    config.option.loadscopereorder = False  # the order is the collection's, set below
    return _scheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On a worker: the session tiers first, then unit and gpu, then the spark tier's modules,
    those with slow tests first (so no long module starts last)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    slow_units = {unit_of_work(item.nodeid) for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        unit = unit_of_work(item.nodeid)
        if unit == SESSION_TIERS:
            return 0
        if unit == IN_PROCESS_TIERS:
            return 1
        return 2 if unit in slow_units else 3

    items.sort(key=rank)  # stable: each unit keeps its tests' order
