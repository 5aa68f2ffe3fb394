"""The DataFrame loader's state_dict/load_state_dict over real Parquet files, without Spark."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sparktrain.data import SparkDatasetConverter
from sparktrain.errors import ConfigurationError
from tests.unit.test_data_sharding import write_ids

ROWS = 120  # 4 shards of 30, 2 of 60, 3 of 40: no padding, so "exactly once" is exact


def loaders(converter: SparkDatasetConverter, count: int, **options: Any) -> list[Any]:
    return [
        converter.make_torch_dataloader(cur_shard=shard, shard_count=count, **options)
        for shard in range(count)
    ]


def take(loader: Any, batches: int) -> list[int]:
    """Ids of the next ``batches`` batches of the loader's current pass."""
    it = loader._pass if loader._pass is not None else iter(loader)
    return [int(i) for _ in range(batches) for i in next(it)["id"]]


@pytest.mark.parametrize("new_size", [2, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_stop_at_four_shards_resume_at_another_size(
    tmp_path: Path, new_size: int, shuffle: bool
) -> None:
    converter = write_ids(tmp_path / "data", ROWS)
    options = dict(batch_size=5, num_epochs=2, shuffle=shuffle, seed=4, prefetch=2)
    first = loaders(converter, 4, **options)
    read = Counter(i for loader in first for i in take(loader, 3))  # 15 rows each, then lost
    states = [loader.state_dict() for loader in first]  # read ahead rows are not counted
    for loader in first:
        loader.close()

    second = loaders(converter, new_size, **options)
    rest: list[list[int]] = []
    for loader in second:
        loader.load_state_dict(states)
        with loader:
            ids = [int(i) for batch in loader for i in batch["id"]]
        rest.append(ids)
    per_epoch = (ROWS - 60) // new_size  # the rest of epoch 0 in equal shares, then epoch 1
    read.update(i for ids in rest for i in ids[:per_epoch])
    assert sorted(read) == list(range(ROWS)) and set(read.values()) == {1}

    # Epoch 1 is the one an uninterrupted run at the new size reads.
    plain = loaders(converter, new_size, **options)
    for ids, loader in zip(rest, plain, strict=True):
        loader.set_epoch(1)
        with loader:
            expected = [int(i) for batch in loader for i in batch["id"]][: ROWS // new_size]
        assert ids[per_epoch:] == expected


def test_same_size_resumes_each_rank_from_its_own_state(tmp_path: Path) -> None:
    converter = write_ids(tmp_path / "data", 50)
    options = dict(batch_size=4, num_epochs=1, seed=2)
    whole = [
        list(take(loader, loader.batches_per_epoch)) for loader in loaders(converter, 2, **options)
    ]
    killed = loaders(converter, 2, **options)
    heads = [take(loader, 2) for loader in killed]
    states = [loader.state_dict() for loader in killed]
    assert states[0]["rows"] == 8 and states[0]["epoch"] == 0
    for shard, loader in enumerate(loaders(converter, 2, **options)):
        loader.load_state_dict(states[shard])  # its own state alone
        with loader:
            tail = [int(i) for batch in loader for i in batch["id"]]
        assert heads[shard] + tail == whole[shard]  # the same rows in the same order


def test_state_is_small_and_survives_torch_save(tmp_path: Path) -> None:
    converter = write_ids(tmp_path / "data", 2000, row_group=50)
    loader = converter.make_torch_dataloader(batch_size=16, cur_shard=1, shard_count=3)
    take(loader, 7)
    state = loader.state_dict()
    torch.save(state, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert loaded == state and state["rows"] == 7 * 16
    assert len(repr(state)) < 400  # a few numbers, not the rows
    loader.close()


def test_finished_epoch_saves_the_next_one(tmp_path: Path) -> None:
    converter = write_ids(tmp_path / "data", 40)
    loader = converter.make_torch_dataloader(batch_size=5, cur_shard=0, shard_count=2, num_epochs=3)
    take(loader, loader.batches_per_epoch)
    state = loader.state_dict()
    assert (state["epoch"], state["rows"], state["stages"]) == (1, 0, [])
    loader.close()


def test_set_epoch_to_another_epoch_drops_the_restored_place(tmp_path: Path) -> None:
    converter = write_ids(tmp_path / "data", 40)
    first = converter.make_torch_dataloader(batch_size=5, cur_shard=0, shard_count=1, num_epochs=1)
    take(first, 2)
    state = first.state_dict()
    first.close()
    loader = converter.make_torch_dataloader(batch_size=5, cur_shard=0, shard_count=1, num_epochs=1)
    loader.load_state_dict(state)
    loader.set_epoch(0)  # the restored epoch: keeps the place
    assert len(take(loader, 6)) == 30
    loader.load_state_dict(state)
    loader.set_epoch(3)  # another epoch: read whole
    with loader:
        assert len([batch for batch in loader]) == 8


def test_state_of_other_settings_is_refused(tmp_path: Path) -> None:
    converter = write_ids(tmp_path / "data", 40)
    loader = converter.make_torch_dataloader(batch_size=5, cur_shard=0, shard_count=1, seed=1)
    take(loader, 1)
    state = loader.state_dict()
    loader.close()
    other = converter.make_torch_dataloader(batch_size=4, cur_shard=0, shard_count=1, seed=1)
    with pytest.raises(ConfigurationError, match=r"batch_size: saved 5, now 4"):
        other.load_state_dict(state)
    assert np.array_equal(
        next(iter(other))["id"].numpy(),
        next(
            iter(converter.make_torch_dataloader(batch_size=4, cur_shard=0, shard_count=1, seed=1))
        )["id"].numpy(),
    )  # refused without changing the loader's place


def test_checkpoint_saves_the_loader_beside_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparktrain import checkpoint

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv(checkpoint.RUN_ID_ENV, "run-resume")
    converter = write_ids(tmp_path / "data", 60)
    old = loaders(converter, 3, batch_size=4, num_epochs=1, seed=6)
    heads = [take(loader, 2) for loader in old]
    where = tmp_path / "ckpt"
    # One process stands for three ranks here: it passes their states itself.
    checkpoint.save({"w": torch.ones(2)}, where, 5, loader=[o.state_dict() for o in old])
    ckpt = checkpoint.load_latest(where)  # weights_only=True reads the loader's entry
    assert ckpt is not None and ckpt.state["loader"]["stages"] == [[3, [8, 8, 8]]]
    rest = []
    for loader in loaders(converter, 2, batch_size=4, num_epochs=1, seed=6):
        loader.load_state_dict(ckpt.state["loader"])
        with loader:
            rest.extend(int(i) for batch in loader for i in batch["id"])
    assert sorted(rest + [i for head in heads for i in head]) == list(range(60))

    with pytest.raises(ConfigurationError, match=r"there is none of several ranks; call"):
        checkpoint.save({"w": 1}, where, 6, loader=old[0])
    with pytest.raises(ConfigurationError, match=r"the state must be a dict"):
        checkpoint.save(torch.ones(1), where, 6, loader=old[0])
    with pytest.raises(ConfigurationError, match=r"already has a 'loader' entry"):
        checkpoint.save({"loader": 1}, where, 6, loader=old[0])
    assert checkpoint.load_latest(where).step == 5  # type: ignore[union-attr]  # nothing saved


def test_len_after_a_restore_counts_the_rest(tmp_path: Path) -> None:
    converter = write_ids(tmp_path / "data", 40)
    old = loaders(converter, 2, batch_size=5, num_epochs=2)
    for loader in old:
        take(loader, 3)
    states = [loader.state_dict() for loader in old]
    new = converter.make_torch_dataloader(batch_size=5, cur_shard=0, shard_count=1, num_epochs=2)
    assert len(new) == 16
    new.load_state_dict(states)
    # 40 - 30 rows left of epoch 0 (2 batches on one rank), then epoch 1 whole (8).
    assert len(new) == 10
    with new:
        assert len(list(new)) == 10


def test_state_after_leaving_a_pass_early_is_where_it_stood(tmp_path: Path) -> None:
    converter = write_ids(tmp_path / "data", 40)
    with converter.make_torch_dataloader(batch_size=5, cur_shard=0, shard_count=2) as loader:
        for step, _batch in enumerate(loader, 1):
            if step == 2:
                break
    assert loader.state_dict()["rows"] == 10  # after the with block closed the pass
    loader.set_epoch(1)
    assert (loader.state_dict()["epoch"], loader.state_dict()["rows"]) == (1, 0)
