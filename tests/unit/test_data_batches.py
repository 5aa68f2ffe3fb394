"""How the loader builds batches: gathered from Arrow per batch, the same with or without
threads, in memory each batch owns, with every column of a row kept together."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sparktrain.data import SparkDatasetConverter

THREADS = [
    {"read_ahead": True, "prefetch": 0},
    {"read_ahead": False, "prefetch": 0},
    {"read_ahead": True, "prefetch": 3},
    {"read_ahead": False, "prefetch": 3},
]


def write_rows(path: Path, rows: int) -> SparkDatasetConverter:
    """Rows whose every column is derived from ``id``, over files with uneven row groups."""
    path.mkdir(parents=True, exist_ok=True)
    bounds = [0, rows // 3, rows]
    for index in range(2):
        ids = np.arange(bounds[index], bounds[index + 1])
        table = pa.table(
            {
                "id": ids,
                "arr": pa.array([[float(i), -float(i)] for i in ids], pa.list_(pa.float32())),
                "fixed": pa.array([[int(i)] * 3 for i in ids], pa.list_(pa.int32(), 3)),
                "raw": pa.array([str(i).encode() for i in ids], pa.binary()),
                "flag": pa.array([bool(i % 2) for i in ids]),
            }
        )
        pq.write_table(table, path / f"part-{index}.parquet", row_group_size=5 + 2 * index)
    return SparkDatasetConverter.from_parquet(str(path))


def ids_of(converter: SparkDatasetConverter, **options: object) -> list[list[int]]:
    with converter.make_torch_dataloader(**options) as loader:  # type: ignore[arg-type]
        return [batch["id"].tolist() for batch in loader]


@pytest.mark.parametrize("shuffle_window", [1, 2, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_threads_do_not_change_the_batches(
    tmp_path: Path, shuffle_window: int, shuffle: bool
) -> None:
    converter = write_rows(tmp_path, 101)
    for shard in (0, 1):
        options = {
            "batch_size": 6,
            "num_epochs": 2,
            "shuffle": shuffle,
            "shuffle_window": shuffle_window,
            "seed": 4,
            "cur_shard": shard,
            "shard_count": 2,
        }
        seen = [ids_of(converter, **options, **threads) for threads in THREADS]
        assert all(batches == seen[0] for batches in seen[1:])
        assert len(seen[0]) == 2 * 9  # ceil(ceil(101 / 2) / 6) batches per epoch


@pytest.mark.parametrize("batch_size", [1, 7, 16, 67])
def test_every_column_of_a_row_stays_together(tmp_path: Path, batch_size: int) -> None:
    converter = write_rows(tmp_path, 67)
    ids: list[int] = []
    with converter.make_torch_dataloader(
        batch_size, num_epochs=2, seed=9, shuffle_window=3, cur_shard=0, shard_count=1
    ) as loader:
        for batch in loader:
            ident = batch["id"]
            ids.extend(ident.tolist())
            assert batch["arr"].dtype == torch.float32 and batch["arr"].shape == (len(ident), 2)
            assert torch.equal(batch["arr"][:, 0], ident.float())
            assert torch.equal(batch["arr"][:, 1], -ident.float())
            assert batch["fixed"].dtype == torch.int32
            assert torch.equal(batch["fixed"], ident.int()[:, None].expand(-1, 3))
            assert batch["raw"] == [str(i).encode() for i in ident.tolist()]
            assert torch.equal(batch["flag"], ident % 2 == 1)
    first, second = ids[:67], ids[67:]
    assert sorted(first) == sorted(second) == list(range(67))
    assert first != second and first != sorted(first)  # shuffled, differently per epoch


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_own_writable_memory(tmp_path: Path, shuffle: bool) -> None:
    converter = write_rows(tmp_path, 40)
    options = {"shuffle": shuffle, "cur_shard": 0, "shard_count": 1, "shuffle_window": 2}
    with converter.make_torch_dataloader(8, **options) as loader:
        with warnings.catch_warnings():
            # torch warns when it wraps a read-only array (Arrow's memory is read-only).
            warnings.simplefilter("error")
            batches = list(loader)
        expected = [batch["arr"].clone() for batch in batches]
        for batch in batches:
            assert batch["arr"].is_contiguous()
            batch["arr"].mul_(0)  # writes to the batch only
        loader.set_epoch(0)
        again = [batch["arr"] for batch in loader]
    assert all(torch.equal(a, b) for a, b in zip(again, expected, strict=True))
    assert any(bool(a.any()) for a in again)
    pointers = {batch["arr"].data_ptr() for batch in batches}
    assert len(pointers) == len(batches)


def test_a_pass_never_started_leaves_no_thread(tmp_path: Path) -> None:
    converter = write_rows(tmp_path, 50)
    # Threads are told apart by identity: other tests' threads may end meanwhile.
    before = set(threading.enumerate())

    def new_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t not in before]

    with converter.make_torch_dataloader(5, num_epochs=None, cur_shard=0, shard_count=1) as dl:
        iter(dl)  # its read-ahead thread starts, but no batch is ever asked for
        (first,) = new_threads()
        second = iter(dl)
        assert not first.is_alive()  # the first pass's thread has ended
        assert len(new_threads()) == 1
        assert len(next(second)["id"]) == 5
    assert new_threads() == []
