"""``checkpoint.save`` returns on every rank only once rank 0 has committed the checkpoint."""

from __future__ import annotations

from pathlib import Path

from sparktrain import SparkRunner

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
