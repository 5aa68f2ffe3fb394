"""Sharded checkpoints: FSDP (gloo, CPU) saved at 4 ranks, loaded at 2 and 3, kill-safe.

One run of 4 ranks trains a tiny FSDP model two steps and saves after each
(``sharded=True``), then starts a third save in which rank 0 dies once every rank's shards
and DCP's metadata are written, before the commit marker. Runs of 3 and 2 ranks then load
the newest checkpoint into a fresh FSDP model of their own, put it into the model and
optimizer (``set_state_dict``), and save that again, sharded. The reference is step 2 read
whole by one process (DCP's ``dcp_to_torch_save``); each re-saved state, read the same way,
must equal it: parameters and Adam's moments, unchanged through 4 → 3 and 4 → 2 ranks. (A
fresh model that loaded nothing would save its initial parameters and zero moments.) The
2-rank run also checks the error of the wrong spelling, and its save at step 3 deletes the
torn folder.
"""

from __future__ import annotations

import json
import os
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from sparktrain import SparkRunner, checkpoint  # noqa: E402
from sparktrain.errors import ConfigurationError, WorkerFailedError  # noqa: E402
from tests.fixtures.sharded_trainers import assert_same, read_whole  # noqa: E402


def _fsdp() -> tuple[Any, Any]:
    """A tiny FSDP model and its Adam optimizer, the same on every rank and at every size."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)
    )
    model = FSDP(model, device_id=torch.device("cpu"))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _state(model: Any, optim: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd}


def _train_save_then_die(directory: str) -> None:
    import torch.distributed as dist

    from sparktrain.checkpoint import _sharded

    model, optim = _fsdp()
    rank = dist.get_rank()
    for step in (1, 2):
        torch.manual_seed(100 * step + rank)  # each rank its own batch
        loss = model(torch.randn(5, 8)).pow(2).sum()
        loss.backward()
        optim.step()
        optim.zero_grad()
        checkpoint.save(
            {**_state(model, optim), "step": step}, directory, step, keep_last=2, sharded=True
        )

    def die(*args: Any, **kwargs: Any) -> None:
        os._exit(3)  # every rank's shards and DCP's .metadata are in; no commit marker yet

    if rank == 0:
        _sharded._commit_sharded = die
    checkpoint.save({**_state(model, optim), "step": 3}, directory, 3, sharded=True)


def _load(directory: str, again: str, check_spelling: bool) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model, optim = _fsdp()
    state = {**_state(model, optim), "step": -1}
    seen: dict[str, Any] = {}
    if check_spelling:
        try:
            checkpoint.load_latest(directory)
        except ConfigurationError as exc:
            seen["whole_spelling"] = str(exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", checkpoint.CheckpointWarning)
        found = checkpoint.load_latest(directory, into=state)
    assert found is not None
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    seen.update(step=found.step, saved_step=state["step"])
    seen["warnings"] = [str(w.message) for w in caught]
    seen["resaved"] = checkpoint.save(
        {**_state(model, optim), "step": 2}, again, 3, keep_last=2, sharded=True
    )
    dist.barrier()
    seen["names"] = sorted(os.listdir(again))
    return seen


def test_sharded_fsdp_saved_at_4_ranks_loads_at_3_and_2_and_survives_a_torn_save(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path / "ckpt")
    with pytest.raises(WorkerFailedError):
        SparkRunner(np=-4, progress=False).run(_train_save_then_die, directory)
    torn = [n for n in os.listdir(directory) if n.startswith("step-000000000003")]
    assert len(torn) == 1 and torn[0].endswith(".dcp")  # written in full, never committed
    assert ".metadata" in os.listdir(Path(directory) / torn[0])
    (step2,) = [
        n
        for n in os.listdir(directory)
        if n.startswith("step-000000000002.") and n.endswith(".dcp")
    ]
    expected = read_whole(str(Path(directory) / step2), tmp_path / "expected.pt")
    assert expected["step"] == 2 and expected["optim"]["state"]  # Adam's moments are in

    three = SparkRunner(np=-3, progress=False).run(_load, directory, str(tmp_path / "at3"), False)
    two = SparkRunner(np=-2, progress=False).run(_load, directory, directory, True)
    for size, seen in ((3, three), (2, two)):
        assert (seen["step"], seen["saved_step"]) == (2, 2)
        assert any(torn[0] in w and "no commit marker" in w for w in seen["warnings"])
        assert_same(expected, read_whole(seen["resaved"], tmp_path / f"at{size}.pt"))
    assert "is sharded (saved with sharded=True)" in two["whole_spelling"]
    assert "load_latest(directory, into=state)" in two["whole_spelling"]
    # The 2-rank save of step 3 deleted the torn folder and, keep_last=2, step 1.
    names = two["names"]
    assert torn[0] not in names
    assert [n for n in names if n.endswith(".commit.json")] == [
        "step-000000000002.commit.json",
        "step-000000000003.commit.json",
    ]
    assert len([n for n in names if n.endswith(".dcp")]) == 2


def _plain(value: float) -> dict[str, Any]:
    return {"w": torch.full((6,), value), "nested": {"b": torch.full((2,), value)}, "n": value}


@pytest.fixture(params=["local", "memory"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "ckpt")
    pytest.importorskip("fsspec")
    return f"memory://sharded-{uuid.uuid4().hex}/run1"


def test_one_process_saves_and_loads_sharded_in_place_with_keep_last(where: str) -> None:
    import fsspec

    first = checkpoint.save(_plain(1.0), where, 1, sharded=True)
    path = checkpoint.save(_plain(2.0), where, 2, sharded=True, keep_last=1)
    assert (
        path is not None
        and path.startswith(f"{where}/step-000000000002.")
        and path.endswith(".dcp")
    )
    fs, root = fsspec.core.url_to_fs(where)
    names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    assert first is not None and first.rsplit("/", 1)[-1] not in names  # keep_last=1
    assert {n for n in names if n.startswith("step-")} == {
        "step-000000000002.commit.json",
        path.rsplit("/", 1)[-1],
    }
    marker = json.loads(fs.cat_file(f"{root}/step-000000000002.commit.json"))
    assert marker["sharded"] is True and ".metadata" in marker["files"]
    assert marker["size"] == sum(entry["size"] for entry in marker["files"].values()) > 0

    into = _plain(0.0)
    found = checkpoint.load_latest(where, into=into)
    assert found is not None and (found.step, found.path) == (2, path) and found.state is into
    assert_same(_plain(2.0), into)


def test_a_corrupted_shard_is_skipped_and_the_previous_checkpoint_loads(tmp_path: Path) -> None:
    where = str(tmp_path / "ckpt")
    assert checkpoint.load_latest(where, into=_plain(0.0)) is None  # nothing saved yet
    checkpoint.save(_plain(1.0), where, 1, sharded=True)
    newest = checkpoint.save(_plain(2.0), where, 2, sharded=True)
    assert newest is not None
    (shard,) = Path(newest).glob("__0_*.distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))

    into = _plain(0.0)
    with pytest.warns(checkpoint.CheckpointWarning, match=f"{shard} is corrupted"):
        found = checkpoint.load_latest(where, into=into)
    assert found is not None and found.step == 1
    assert_same(_plain(1.0), into)


def test_a_whole_checkpoint_loaded_into_a_state_says_how_to_load_it(tmp_path: Path) -> None:
    checkpoint.save(_plain(1.0), tmp_path, 1)
    into = _plain(0.0)
    with pytest.raises(ConfigurationError) as err:
        checkpoint.load_latest(tmp_path, into=into)
    assert "is a whole one (saved without sharded=True)" in str(err.value)
    assert "load_latest(directory) and no into=" in str(err.value)
    assert_same(_plain(0.0), into)  # untouched
    assert checkpoint.load_latest(tmp_path).step == 1  # the spelling it names works


def test_a_sharded_save_keeps_the_loaders_place_and_loads_it_at_another_size(
    tmp_path: Path,
) -> None:
    from sparktrain.data import ResumableDistributedSampler

    # One process stands for two ranks here: it passes their states itself.
    old = [ResumableDistributedSampler(30, num_replicas=2, rank=r, seed=3) for r in range(2)]
    heads = []
    for sampler in old:
        order = iter(sampler)
        heads.extend(next(order) for _ in range(3))  # 24 rows left: 8 for each of 3
    where = tmp_path / "ckpt"
    checkpoint.save(_plain(1.0), where, 1, sharded=True)
    path = checkpoint.save(
        _plain(2.0), where, 2, sharded=True, loader=[s.state_dict() for s in old]
    )
    marker = json.loads((where / "step-000000000002.commit.json").read_text())
    assert path is not None and "loader.json" in marker["files"]

    into = _plain(0.0)
    found = checkpoint.load_latest(where, into=into)
    assert found is not None and found.step == 2 and found.state is into
    assert_same(_plain(2.0), {k: v for k, v in into.items() if k != "loader"})
    rest: list[int] = []
    for rank in range(3):
        sampler = ResumableDistributedSampler(30, num_replicas=3, rank=rank, seed=3)
        sampler.load_state_dict(into["loader"])
        rest.extend(sampler)
    assert sorted(heads + rest) == list(range(30))  # every row once, at 3 ranks

    text = (Path(path) / "loader.json").read_text()
    (Path(path) / "loader.json").write_text(text.replace("3", "4", 1))  # same size, altered
    older = _plain(0.0)
    with pytest.warns(checkpoint.CheckpointWarning, match="loader.json is corrupted"):
        found = checkpoint.load_latest(where, into=older)
    assert found is not None and found.step == 1 and "loader" not in older  # saved without one
    assert_same(_plain(1.0), older)

    # A state that asks for the loader's place of a checkpoint saved without one.
    checkpoint.save(_plain(3.0), where, 3, sharded=True)
    wrong = {**_plain(0.0), "loader": None}
    with pytest.raises(ConfigurationError, match=r"3 of .* saved without loader=, so it holds no"):
        checkpoint.load_latest(where, into=wrong)
    assert wrong["loader"] is None
    assert_same(_plain(0.0), {k: v for k, v in wrong.items() if k != "loader"})  # untouched


def test_a_sharded_save_with_a_loader_refuses_a_state_with_a_loader_entry(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigurationError, match=r"already has a 'loader' entry"):
        checkpoint.save({"loader": 1}, tmp_path / "ckpt", 1, sharded=True, loader=[{}])
    assert not (tmp_path / "ckpt").exists()


def test_a_sharded_save_into_another_live_runs_directory_is_refused_unwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.save(_plain(1.0), tmp_path, 1, sharded=True)
    before = sorted(os.listdir(tmp_path))
    monkeypatch.setenv(checkpoint.RUN_ID_ENV, "another-run")
    with pytest.raises(checkpoint.CheckpointOwnershipError, match="another-run"):
        checkpoint.save(_plain(2.0), tmp_path, 2, sharded=True)
    assert sorted(os.listdir(tmp_path)) == before  # no folder of step 2
