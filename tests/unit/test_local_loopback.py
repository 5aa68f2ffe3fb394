"""A run with ``np < 0`` listens on loopback only (the ranks' store included), and the
checkpoint commit word in that store is believed only when rank 0 signed it with the run's key:
a forged "committed", a forged error or a value of the wrong shape is a clear
``CheckpointError``, never an early return or the forger's text."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from sparktrain import SparkRunner
from sparktrain.backends.horovod_install import installed_horovod
from sparktrain.checkpoint import _commit
from sparktrain.checkpoint._errors import CheckpointError


def _listeners(process: psutil.Process) -> list[tuple[int, str, str, int]]:
    """Every listening TCP socket and every UDP socket of ``process``: (pid, kind, ip, port)."""
    found = []
    for conn in process.net_connections(kind="inet"):
        if conn.type.name == "SOCK_DGRAM" or conn.status == psutil.CONN_LISTEN:
            found.append((process.pid, conn.type.name, conn.laddr.ip, conn.laddr.port))
    return found


def _run_listeners(driver: int) -> dict[str, Any]:
    """On each rank, once the process group and its store are up: the listeners of this rank's
    process and of every process between it and the driver; rank 0 adds the driver's."""
    import torch.distributed as dist

    import sparktrain

    dist.init_process_group(sparktrain.default_backend())
    dist.barrier()
    mine: list[tuple[int, str, str, int]] = []
    process: psutil.Process | None = psutil.Process()
    while process is not None and process.pid != driver:
        mine += _listeners(process)
        process = process.parent()
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    driver_side = _listeners(psutil.Process(driver))
    dist.barrier()
    return {
        "ranks": [entry for rank in everyone for entry in rank],
        "driver": driver_side,
        "master_port": int(os.environ["MASTER_PORT"]),
    }


def _loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip.split("%")[0]).is_loopback


def test_every_listener_of_a_local_torch_run_is_on_loopback() -> None:
    before = set(_listeners(psutil.Process()))
    seen = SparkRunner(np=-2, progress=False).run(_run_listeners, os.getpid())
    found = seen["ranks"] + [entry for entry in seen["driver"] if entry not in before]
    # What was looked at: rank 0's store on MASTER_PORT, and Gloo's own listeners.
    assert any(port == seen["master_port"] for _pid, _kind, _ip, port in found), found
    assert len({pid for pid, *_ in seen["ranks"]}) == 2, found
    assert [entry for entry in found if not _loopback(entry[2])] == []


def _hvd_listeners(driver: int) -> dict[str, Any]:
    import horovod.torch as hvd

    hvd.init()
    hvd.allreduce_(__import__("torch").zeros(1), name="up")
    mine: list[tuple[int, str, str, int]] = []
    process: psutil.Process | None = psutil.Process()
    while process is not None and process.pid != driver:
        mine += _listeners(process)
        process = process.parent()
    everyone = hvd.allgather_object(mine)
    driver_side = _listeners(psutil.Process(driver))
    hvd.allreduce_(__import__("torch").zeros(1), name="down")
    return {
        "ranks": [entry for rank in everyone for entry in rank],
        "driver": driver_side,
        "rendezvous_port": int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
    }


@pytest.mark.horovod
@pytest.mark.skipif(
    installed_horovod() is None,
    # horovod.torch always imports (sparktrain's stand-in), and the built-in implementation
    # has no rendezvous server of Horovod's to look at.
    reason="Horovod is not installed (scripts/install-horovod.sh)",
)
def test_every_listener_of_a_local_horovod_run_is_on_loopback() -> None:
    from sparktrain import HorovodRunner

    before = set(_listeners(psutil.Process()))
    seen = HorovodRunner(np=-2, driver_log_verbosity="all").run(_hvd_listeners, os.getpid())
    found = seen["ranks"] + [entry for entry in seen["driver"] if entry not in before]
    # Horovod's rendezvous server runs in the driver (the ranks' Gloo keeps no listener open
    # once connected, here).
    assert any(port == seen["rendezvous_port"] for _pid, _kind, _ip, port in found), found
    assert [entry for entry in found if not _loopback(entry[2])] == []


# -- the commit word ------------------------------------------------------------------------


def _forge_then_save(directory: str) -> list[str]:
    """Rank 1 writes forged words into the store through a connection of its own (what any
    process that reaches the port can do), then calls save as if rank 0 had; rank 0 never
    saves these steps, so only the forgeries are there to be read."""
    import json
    from datetime import timedelta

    import torch.distributed as dist

    from sparktrain import checkpoint

    dist.init_process_group("gloo")
    heard: list[str] = []
    if dist.get_rank() == 1:
        forger = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            None,
            False,
            timedelta(seconds=30),
        )
        forged = {
            5: json.dumps({"path": "/elsewhere/step-5.pt"}),  # the unsigned form
            6: json.dumps(
                {"outcome": json.dumps({"error": "EvilError: do as I say"}), "mac": "0" * 64}
            ),
            7: json.dumps({"outcome": 7, "mac": None}),
            8: b"\xff\x00 not json",
        }
        group_store = dist.distributed_c10d._get_default_store()
        for step, value in forged.items():
            # The default group's keys, as torch 2.13 names them on the server.
            forged_key = f"default_pg/0//{_commit._key(directory, step)}"
            forger.set(forged_key, value)
            # A store's set is sent without a reply; a question on the same connection is
            # answered only after it, so the forgery is in place before another connection looks.
            forger.check([forged_key])
            if not group_store.check([_commit._key(directory, step)]):
                heard.append(f"the forged word for step {step} is not where the ranks look")
        for step in forged if not heard else ():
            try:
                checkpoint.save({"step": step}, directory, step=step)
                heard.append(f"save of step {step} returned")
            except CheckpointError as exc:
                heard.append(str(exc))
    said: list[Any] = [None, None]
    dist.all_gather_object(said, heard)
    return said[1]


def test_forged_commit_words_in_the_store_are_refused_clearly(tmp_path: Path) -> None:
    heard = SparkRunner(np=-2, progress=False).run(_forge_then_save, str(tmp_path / "ckpt"))
    assert len(heard) == 4 and not any("returned" in line for line in heard), heard
    assert not any("not where the ranks look" in line for line in heard), heard
    unsigned, bad_mac, wrong_type, garbage = heard
    assert "cannot tell whether rank 0 committed checkpoint 5 of" in unsigned
    assert "something that is not rank 0's word" in unsigned
    assert "not signed with this run's key, so it is refused" in bad_mac
    assert "EvilError" not in bad_mac
    assert "something that is not rank 0's word" in wrong_type
    assert "TypeError: the outcome or its signature is not a string" in wrong_type
    assert "something that is not rank 0's word" in garbage
    for line in heard:
        assert "another process that reaches the store (MASTER_ADDR:MASTER_PORT)" in line


def test_rank_0s_word_reads_back_and_only_with_the_run_key() -> None:
    name = _commit._key("/ckpt", 3)
    key = os.urandom(32)
    value = _commit.encode(name, {"path": "/ckpt/step-3.pt"}, key)
    assert _commit.decode(name, value, key) == {"path": "/ckpt/step-3.pt"}
    with pytest.raises(CheckpointError, match="not signed with this run's key"):
        _commit.decode(name, value, os.urandom(32))
    # Signed for another step: refused too (the store key is part of what is signed).
    with pytest.raises(CheckpointError, match="not signed with this run's key"):
        _commit.decode(_commit._key("/ckpt", 4), value, key)
    # Outside sparktrain (no run key) the word is unsigned and still read.
    assert _commit.decode(name, _commit.encode(name, {"error": "E: x"}, None), None) == {
        "error": "E: x"
    }
    with pytest.raises(CheckpointError, match="an outcome of an unknown shape"):
        _commit.decode(name, _commit.encode(name, {"path": 5}, None), None)  # type: ignore[dict-item]
