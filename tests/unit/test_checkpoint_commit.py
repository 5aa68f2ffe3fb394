"""``checkpoint.save`` returns on every rank only once rank 0 has committed the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sparktrain import SparkRunner, checkpoint

# How long rank 0 gives rank 1 to show that it got past save() before the commit.
_LOOK = 2.0


def _wait_for(path: str, seconds: float) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if Path(path).exists():
            return True
        time.sleep(0.02)
    return False


class _HoldsRank0:
    """Pickled by rank 0's torch.save: before the checkpoint is written, rank 0 waits a while
    for rank 1 to say it already loaded (what a save that does not wait would let it do)."""

    def __init__(self, loaded: str) -> None:
        self.loaded = loaded

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        _wait_for(self.loaded, _LOOK)
        return (int, (7,))


def _save_then_load(directory: str, loaded: str) -> list:
    import torch.distributed as dist

    from sparktrain import checkpoint

    dist.init_process_group("gloo")
    returned = checkpoint.save({"held": _HoldsRank0(loaded)}, directory, step=3)
    found = checkpoint.load_latest(directory, weights_only=False)
    if dist.get_rank() == 1:
        Path(loaded).touch()
    seen = [None, None]
    dist.all_gather_object(seen, (returned, None if found is None else found.step))
    dist.barrier()
    return seen


def test_rank_1_loads_the_checkpoint_right_after_its_save_returns(tmp_path: Path) -> None:
    seen = SparkRunner(np=-2, progress=False).run(
        _save_then_load, str(tmp_path / "ckpt"), str(tmp_path / "rank1-loaded")
    )
    (path0, step0), (path1, step1) = seen
    assert path0 is not None and Path(path0).is_file() and path1 is None
    assert (step0, step1) == (3, 3)


def _save_on_rank_0_only(directory: str) -> int:
    import torch.distributed as dist

    from sparktrain import checkpoint

    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        checkpoint.save({"w": 1}, directory, step=1)
    dist.barrier()
    latest = checkpoint.load_latest(directory)
    return -1 if latest is None else latest.step


def test_save_called_on_rank_0_alone_does_not_wait_for_the_others(tmp_path: Path) -> None:
    assert SparkRunner(np=-2, progress=False).run(_save_on_rank_0_only, str(tmp_path)) == 1


class _Unsaveable:
    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        raise ValueError("this state cannot be written")


def _rank_0_cannot_save(directory: str) -> list:
    import torch.distributed as dist

    from sparktrain import checkpoint

    dist.init_process_group("gloo")
    try:
        checkpoint.save({"bad": _Unsaveable()}, directory, step=2)
        said = "saved"
    except (ValueError, checkpoint.CheckpointError) as exc:
        said = f"{type(exc).__name__}: {exc}"
    heard = [None, None]
    dist.all_gather_object(heard, said)
    return heard


def test_rank_1_hears_why_rank_0_could_not_save(tmp_path: Path) -> None:
    rank0, rank1 = SparkRunner(np=-2, progress=False).run(_rank_0_cannot_save, str(tmp_path))
    assert "this state cannot be written" in rank0 and rank0.startswith("ValueError")
    assert rank1.startswith("CheckpointError: rank 0 could not save checkpoint 2 of ")
    assert rank1.endswith("ValueError: this state cannot be written")


def _save_last_after_rank_0_ended(directory: str, rank0_pid: str, sharded: bool) -> object:
    """Each rank's function ends with its save; rank 1 asks for rank 0's word only once rank
    0's process (which holds the process group's store) has ended, as a slower rank may."""
    import os

    import psutil
    import torch
    import torch.distributed as dist

    from sparktrain import checkpoint
    from sparktrain.checkpoint import _commit

    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        Path(rank0_pid + ".tmp").write_text(str(os.getpid()))
        os.replace(rank0_pid + ".tmp", rank0_pid)
    else:
        asked = _commit.wait

        def after_rank_0_ended(*args: object) -> None:
            assert _wait_for(rank0_pid, 60)
            rank0 = psutil.Process(int(Path(rank0_pid).read_text()))
            psutil.wait_procs([rank0], timeout=60)
            assert not rank0.is_running()
            asked(*args)  # type: ignore[arg-type]

        _commit.wait = after_rank_0_ended  # type: ignore[assignment]
    return checkpoint.save({"w": torch.full((4,), 7.0)}, directory, step=1, sharded=sharded)


@pytest.mark.parametrize("sharded", [False, True], ids=["whole", "sharded"])
def test_a_save_that_ends_the_function_returns_on_a_rank_slower_than_rank_0(
    tmp_path: Path, sharded: bool
) -> None:
    """Rank 0 returns from its last save and its process ends, taking the process group's
    store with it; rank 1 then reads the commit marker instead of rank 0's word in the store,
    and the run succeeds."""
    directory = str(tmp_path / "ckpt")
    returned = SparkRunner(np=-2, progress=False).run_all(
        _save_last_after_rank_0_ended, directory, str(tmp_path / "rank0.pid"), sharded
    )
    assert returned[1] is None and returned[0] is not None
    assert checkpoint.load_latest(directory, into={"w": torch.zeros(4)} if sharded else None)
