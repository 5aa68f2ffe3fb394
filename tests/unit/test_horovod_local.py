"""The Horovod backend for real, without Spark: ``prepare()`` starts Horovod's rendezvous
server, ranks are plain subprocesses given ``rank_env + env``, and ``hvd.init()`` must agree
with sparktrain's layout. Extra "hosts" are other loopback addresses (127.0.0.2, ...), which
are separate hosts to Horovod's rendezvous (scopes ``local_<host>``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sparktrain.backends import get_backend
from sparktrain.backends.base import rank_env
from sparktrain.backends.horovod import horovod_slots
from sparktrain.backends.horovod_install import horovod_torch_library
from sparktrain.config import RunConfig
from sparktrain.layout.cluster import TaskInfo, build_cluster_spec

pytestmark = [
    pytest.mark.horovod,
    pytest.mark.skipif(
        horovod_torch_library() is None,
        reason="horovod.torch is not importable: build it with scripts/install-horovod.sh",
    ),
]

WORKER = r"""
import json, os
import torch
import horovod.torch as hvd

hvd.init()
x = torch.tensor([float(hvd.rank() + 1)])
total = hvd.allreduce(x, op=hvd.Sum).item()
root = hvd.broadcast(torch.tensor([float(hvd.rank() + 100)]), root_rank=0).item()
places = hvd.allgather_object(
    [hvd.rank(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]
)
print("RESULT " + json.dumps({
    "env_rank": int(os.environ["RANK"]), "rank": hvd.rank(), "size": hvd.size(),
    "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
    "total": total, "root": root, "places": places,
}), flush=True)
hvd.shutdown()
"""


def _loopback_interface() -> str | None:
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addrs):
            return name
    return None


def _run(hosts: list[str], node: str = "auto") -> None:
    """Run one rank per entry of ``hosts`` (task i on hosts[i]) and check what hvd says."""
    ifname = _loopback_interface()
    infos = [TaskInfo(index=i, host=h, port=0, ifname=ifname) for i, h in enumerate(hosts)]
    spec = build_cluster_spec(infos, node)
    config = RunConfig(
        np=-len(hosts), backend="horovod", start_timeout=60, use_gpu=False, node=node
    )
    backend = get_backend("horovod")
    backend.check(config)
    procs: list[subprocess.Popen[str]] = []
    shared = backend.prepare(spec, config)
    try:
        for rank in spec.ranks:
            env = dict(os.environ)
            env.update(rank_env(spec, rank, config))
            env.update(backend.env(spec, rank, shared, config))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", WORKER],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        backend.teardown()
    results = []
    for rank, proc, out in zip(spec.ranks, procs, outputs, strict=True):
        assert proc.returncode == 0, f"rank {rank.rank} exited {proc.returncode}:\n{out}"
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT ") :]))
    n = len(hosts)
    expected_places = [
        [s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size]
        for s in horovod_slots(spec)
    ]
    for rank, got in zip(spec.ranks, results, strict=True):
        slot = horovod_slots(spec)[rank.rank]
        assert got["rank"] == got["env_rank"] == rank.rank
        assert got["size"] == n
        assert (got["local_rank"], got["local_size"]) == (rank.local_rank, rank.local_world_size)
        assert (got["cross_rank"], got["cross_size"]) == (slot.cross_rank, slot.cross_size)
        assert got["total"] == n * (n + 1) / 2
        assert got["root"] == 100.0
        assert got["places"] == expected_places


def test_two_ranks_one_host() -> None:
    _run(["127.0.0.1", "127.0.0.1"])


def test_three_ranks_two_hosts_interleaved() -> None:
    # Task 1 is on the second host, so RANK 1 is task 2 (ranks are contiguous per host).
    _run(["127.0.0.1", "127.0.0.2", "127.0.0.1"])


def test_every_task_a_node_of_its_own_on_one_host() -> None:
    # node="task": each task is a host of its own to Horovod, so hvd.local_rank() is 0 on
    # both, as LOCAL_RANK is, and cross rank is the task's node rank.
    _run(["127.0.0.1", "127.0.0.1"], node="task")
