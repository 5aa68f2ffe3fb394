"""The data loader without Spark: Parquet written with pyarrow, converters from the files."""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sparktrain.data import SparkDatasetConverter
from sparktrain.data.sharding import plan_shard, row_order_in_piece, shard_size
from sparktrain.errors import ConfigurationError, SparkTrainError

VECTOR = pa.struct(
    [
        ("type", pa.int8()),
        ("size", pa.int32()),
        ("indices", pa.list_(pa.int32())),
        ("values", pa.list_(pa.float64())),
    ]
)


def write_ids(path: Path, rows: int, files: int = 3, row_group: int = 7) -> SparkDatasetConverter:
    """``rows`` rows (column ``id`` = 0..rows-1) over several files with uneven row groups."""
    path.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for index in range(files):
        ids = np.arange(bounds[index], bounds[index + 1], dtype=np.int64)
        table = pa.table({"id": ids, "x": ids.astype(np.float64) * 0.5})
        pq.write_table(table, path / f"part-{index:03d}.parquet", row_group_size=row_group + index)
    return SparkDatasetConverter.from_parquet(str(path))


def read_all(converter: SparkDatasetConverter, **kwargs: object) -> list[list[np.ndarray]]:
    """Batches of ids per shard for one pass."""
    shard_count = int(kwargs.pop("shard_count", 1))  # type: ignore[call-overload]
    out = []
    for shard in range(shard_count):
        loader = converter.make_torch_dataloader(
            cur_shard=shard,
            shard_count=shard_count,
            **kwargs,  # type: ignore[arg-type]
        )
        with loader:
            out.append([batch["id"].numpy() for batch in loader])
    return out


# -- pure index math ------------------------------------------------------------------------


def expand(piece_rows: list[int], plan_rows: list, **order: object) -> list[int]:
    """Global row ids of a shard plan's segments (piece p's rows are numbered after p-1's)."""
    starts = np.concatenate(([0], np.cumsum(piece_rows)))
    ids: list[int] = []
    for segment in plan_rows:
        rows = row_order_in_piece(piece_rows[segment.piece], piece=segment.piece, **order)  # type: ignore[arg-type]
        local = np.arange(piece_rows[segment.piece]) if rows is None else rows
        ids.extend(int(starts[segment.piece] + i) for i in local[segment.start : segment.stop])
    return ids


@pytest.mark.parametrize("total_pieces", [[10], [3, 0, 5, 2], [1, 1, 1], [40, 7, 13, 1]])
@pytest.mark.parametrize("shard_count", [1, 2, 3, 4])
@pytest.mark.parametrize("batch_size", [1, 3, 4])
@pytest.mark.parametrize("shuffle", [False, True])
def test_plan_covers_every_row_once_with_equal_batches(
    total_pieces: list[int], shard_count: int, batch_size: int, shuffle: bool
) -> None:
    total = sum(total_pieces)
    for drop_last in (False, True):
        if drop_last and total < shard_count * batch_size:
            with pytest.raises(ConfigurationError, match="drop_last"):
                shard_size(total, shard_count, batch_size, drop_last)
            continue
        seen: Counter[int] = Counter()
        batches = set()
        for epoch in (0, 1):
            seen.clear()
            batches.clear()
            for shard in range(shard_count):
                plan = plan_shard(
                    total_pieces,
                    shard_count=shard_count,
                    cur_shard=shard,
                    batch_size=batch_size,
                    drop_last=drop_last,
                    epoch=epoch,
                    seed=3,
                    shuffle=shuffle,
                )
                ids = expand(
                    total_pieces, list(plan.segments), epoch=epoch, seed=3, shuffle=shuffle
                )
                assert len(ids) == plan.rows
                seen.update(ids)
                batches.add(plan.batches)
            assert len(batches) == 1, "every shard must yield the same number of batches"
            if drop_last:
                assert max(seen.values()) == 1
                assert total - sum(seen.values()) == plan.dropped < shard_count * batch_size
            else:
                assert set(seen) == set(range(total))
                assert sum(seen.values()) - total == plan.padded < shard_count


def test_shard_size_rule() -> None:
    assert shard_size(10, 4, 2, drop_last=False) == (3, 2)  # 2 rows padded, last batch of 1
    assert shard_size(10, 4, 2, drop_last=True) == (2, 1)  # 2 rows dropped
    assert shard_size(1, 3, 8, drop_last=False) == (1, 1)  # one row, read by all 3 shards
    with pytest.raises(ConfigurationError, match="no rows"):
        shard_size(0, 1, 1, drop_last=False)


# -- the loader over Parquet files ----------------------------------------------------------


@pytest.mark.parametrize("rows", [96, 97])
@pytest.mark.parametrize("shard_count", [1, 2, 3, 4])
def test_loader_exactly_once_per_epoch(tmp_path: Path, rows: int, shard_count: int) -> None:
    converter = write_ids(tmp_path, rows)
    shards = read_all(converter, batch_size=8, shard_count=shard_count, shuffle=True, seed=1)
    assert len({len(batches) for batches in shards}) == 1
    counts = Counter(int(i) for batches in shards for batch in batches for i in batch)
    assert set(counts) == set(range(rows))
    padding = -(-rows // shard_count) * shard_count - rows
    assert sum(counts.values()) == rows + padding


@pytest.mark.parametrize("shard_count", [1, 3])
def test_drop_last_gives_full_batches_and_no_repeats(tmp_path: Path, shard_count: int) -> None:
    converter = write_ids(tmp_path, 100)
    shards = read_all(converter, batch_size=8, shard_count=shard_count, drop_last=True)
    sizes = {len(batch) for batches in shards for batch in batches}
    assert sizes == {8}
    ids = [int(i) for batches in shards for batch in batches for i in batch]
    assert len(ids) == len(set(ids)) == (100 // (8 * shard_count)) * 8 * shard_count


def test_without_shuffle_rows_come_in_file_order(tmp_path: Path) -> None:
    converter = write_ids(tmp_path, 50)
    shards = read_all(converter, batch_size=10, shard_count=2, shuffle=False)
    assert np.concatenate(shards[0]).tolist() == list(range(25))
    assert np.concatenate(shards[1]).tolist() == list(range(25, 50))


def test_shuffle_differs_per_epoch_and_is_reproducible(tmp_path: Path) -> None:
    converter = write_ids(tmp_path, 60)

    def epochs(seed: int) -> list[list[int]]:
        with converter.make_torch_dataloader(
            6, num_epochs=3, seed=seed, cur_shard=0, shard_count=1
        ) as loader:
            ids = torch.cat([batch["id"] for batch in loader]).tolist()
        return [ids[i : i + 60] for i in range(0, 180, 60)]

    first = epochs(seed=7)
    assert all(sorted(epoch) == list(range(60)) for epoch in first)
    assert first[0] != first[1] != first[2]
    assert epochs(seed=7) == first
    assert epochs(seed=8) != first


def test_next_pass_continues_epochs_and_set_epoch_rewinds(tmp_path: Path) -> None:
    converter = write_ids(tmp_path, 30)
    with converter.make_torch_dataloader(30, cur_shard=0, shard_count=1) as loader:
        first = [batch["id"].tolist() for batch in loader]
        second = [batch["id"].tolist() for batch in loader]
        loader.set_epoch(0)
        again = [batch["id"].tolist() for batch in loader]
    assert first != second
    assert again == first


def test_a_new_pass_stops_the_previous_one(tmp_path: Path) -> None:
    converter = write_ids(tmp_path, 20)
    # The loader's own threads: those of earlier tests may end meanwhile, so count new ones.
    before = set(threading.enumerate())
    with converter.make_torch_dataloader(4, num_epochs=None, cur_shard=0, shard_count=1) as loader:
        first = iter(loader)
        next(first)
        second = iter(loader)
        assert len(next(second)["id"]) == 4
        with pytest.raises(SparkTrainError, match="newer pass started"):
            next(first)
        assert len(set(threading.enumerate()) - before) == 1  # the second pass's read-ahead
    assert set(threading.enumerate()) - before == set()


def test_endless_loader(tmp_path: Path) -> None:
    converter = write_ids(tmp_path, 20)
    with converter.make_torch_dataloader(8, num_epochs=None, cur_shard=0, shard_count=1) as loader:
        assert loader.batches_per_epoch == 3
        with pytest.raises(TypeError, match="batches_per_epoch"):
            len(loader)
        batches = iter(loader)
        sizes = [len(next(batches)["id"]) for _ in range(7)]
    assert sizes == [8, 8, 4, 8, 8, 4, 8]


def test_default_shard_comes_from_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    converter = write_ids(tmp_path, 10)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with converter.make_torch_dataloader(5, shuffle=False) as loader:
        assert (loader.cur_shard, loader.shard_count) == (1, 2)
        assert [batch["id"].tolist() for batch in loader] == [[5, 6, 7, 8, 9]]


def test_columns_selection_and_transform(tmp_path: Path) -> None:
    converter = write_ids(tmp_path, 12)
    with converter.make_torch_dataloader(
        4, columns=["x"], cur_shard=0, shard_count=1, transform=lambda b: b["x"] * 2
    ) as loader:
        values = torch.cat(list(loader))
    assert values.dtype == torch.float64
    assert sorted(values.tolist()) == [float(i) for i in range(12)]
    with converter.make_torch_dataloader(4, columns=["id"], cur_shard=0, shard_count=1) as loader:
        assert set(next(iter(loader))) == {"id"}
    with pytest.raises(ConfigurationError, match="unknown column"):
        converter.make_torch_dataloader(4, columns=["nope"], cur_shard=0, shard_count=1)


def test_array_vector_binary_columns(tmp_path: Path) -> None:
    rows = 9
    ids = np.arange(rows)
    vectors = []
    for i in ids:
        if i % 2:  # sparse: size 4, value i at index i % 4
            vectors.append({"type": 0, "size": 4, "indices": [int(i % 4)], "values": [float(i)]})
        else:
            vectors.append({"type": 1, "size": None, "indices": None, "values": [float(i)] * 4})
    table = pa.table(
        {
            "id": ids,
            "arr": pa.array([[float(i), -float(i), 0.5] for i in ids], pa.list_(pa.float64())),
            "vec": pa.array(vectors, VECTOR),
            "raw": pa.array([bytes([i]) * 3 for i in ids], pa.binary()),
            "flag": pa.array([bool(i % 3) for i in ids]),
        }
    )
    pq.write_table(table, tmp_path / "data.parquet", row_group_size=4)
    converter = SparkDatasetConverter.from_parquet(str(tmp_path), dtype="float32")
    with converter.make_torch_dataloader(rows, cur_shard=0, shard_count=1, shuffle=False) as loader:
        (batch,) = list(loader)
    assert batch["arr"].shape == (rows, 3) and batch["arr"].dtype == torch.float32
    assert batch["arr"][4].tolist() == [4.0, -4.0, 0.5]
    assert batch["vec"].shape == (rows, 4) and batch["vec"].dtype == torch.float32
    assert batch["vec"][2].tolist() == [2.0] * 4
    assert batch["vec"][5].tolist() == [0.0, 5.0, 0.0, 0.0]
    assert batch["raw"][3] == b"\x03\x03\x03" and isinstance(batch["raw"], list)
    assert batch["flag"].dtype == torch.bool and batch["flag"].tolist()[:3] == [False, True, True]
    assert batch["id"].dtype == torch.int64


def test_nulls_in_a_feature_column_are_refused(tmp_path: Path) -> None:
    table = pa.table({"id": [1, 2, 3], "x": [1.0, None, 3.0], "tag": ["a", None, "c"]})
    pq.write_table(table, tmp_path / "data.parquet")
    converter = SparkDatasetConverter.from_parquet(str(tmp_path))
    with pytest.raises(ConfigurationError, match=r"column 'x' has 1 null.*dropna"):
        converter.make_torch_dataloader(2, cur_shard=0, shard_count=1)
    # Leaving the column out works; strings may hold nulls (passed as None).
    with converter.make_torch_dataloader(
        3, columns=["id", "tag"], cur_shard=0, shard_count=1, shuffle=False
    ) as loader:
        assert next(iter(loader))["tag"] == ["a", None, "c"]


def test_nulls_inside_arrays_are_refused_when_read(tmp_path: Path) -> None:
    table = pa.table({"arr": pa.array([[1.0, 2.0], [None, 1.0]], pa.list_(pa.float64()))})
    pq.write_table(table, tmp_path / "data.parquet")
    converter = SparkDatasetConverter.from_parquet(str(tmp_path))
    with converter.make_torch_dataloader(2, cur_shard=0, shard_count=1) as loader:
        with pytest.raises(ConfigurationError, match=r"column 'arr' has null elements"):
            list(loader)


def test_ragged_arrays_are_refused(tmp_path: Path) -> None:
    table = pa.table({"arr": pa.array([[1.0, 2.0], [1.0]], pa.list_(pa.float64()))})
    pq.write_table(table, tmp_path / "data.parquet")
    converter = SparkDatasetConverter.from_parquet(str(tmp_path))
    with converter.make_torch_dataloader(2, cur_shard=0, shard_count=1, read_ahead=False) as dl:
        with pytest.raises(ConfigurationError, match="arrays of different lengths"):
            list(dl)


@pytest.mark.parametrize(
    ("array", "shown"),
    [
        (pa.array([1, 2], pa.timestamp("us")), "timestamp"),
        (pa.array([{"a": 1}, {"a": 2}]), "struct"),
        (pa.array([[[1.0]], [[2.0]]]), "list<element: list"),
    ],
)
def test_unsupported_types_are_named(tmp_path: Path, array: pa.Array, shown: str) -> None:
    pq.write_table(pa.table({"id": [1, 2], "odd": array}), tmp_path / "data.parquet")
    converter = SparkDatasetConverter.from_parquet(str(tmp_path))
    with pytest.raises(ConfigurationError, match=rf"column 'odd' has type {shown}"):
        converter.make_torch_dataloader(2, cur_shard=0, shard_count=1)
    with converter.make_torch_dataloader(2, columns=["id"], cur_shard=0, shard_count=1) as loader:
        assert len(list(loader)) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"num_epochs": 0}, "num_epochs"),
        ({"cur_shard": 0}, "both cur_shard and shard_count"),
        ({"cur_shard": 2, "shard_count": 2}, "0 <= cur_shard < shard_count"),
        ({"seed": -1}, "seed"),
        ({"prefetch": -1}, "prefetch"),
        ({"read_ahead": 1}, "read_ahead must be True or False"),
        ({"batch_size": 64, "drop_last": True, "cur_shard": 0, "shard_count": 1}, "drop_last"),
    ],
)
def test_invalid_arguments(tmp_path: Path, kwargs: dict, match: str) -> None:
    converter = write_ids(tmp_path, 10)
    kwargs = {"batch_size": 4, **kwargs}
    with pytest.raises(ConfigurationError, match=match):
        converter.make_torch_dataloader(**kwargs)


def test_empty_dataset_is_refused(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "empty.parquet")
    converter = SparkDatasetConverter.from_parquet(str(tmp_path))
    assert len(converter) == 0
    with pytest.raises(ConfigurationError, match="no rows"):
        converter.make_torch_dataloader(4, cur_shard=0, shard_count=1)
    with pytest.raises(ConfigurationError, match="no Parquet files"):
        SparkDatasetConverter.from_parquet(str(tmp_path / "nothing"))


def test_converter_pickles_manifest_roundtrips_and_deletes(tmp_path: Path) -> None:
    converter = write_ids(tmp_path / "ds", 25)
    assert len(converter) == 25 and converter.columns == ["id", "x"]
    assert converter.schema.field("id").type == pa.int64()
    clone = pickle.loads(pickle.dumps(converter))
    again = SparkDatasetConverter.from_manifest(converter.url, converter.to_manifest())
    for other in (clone, again):
        assert other is not None
        assert (other.files, other.pieces, other.schema) == (
            converter.files,
            converter.pieces,
            converter.schema,
        )
        assert sorted(np.concatenate(read_all(other, batch_size=10)[0]).tolist()) == list(range(25))
    converter.delete()
    assert not (tmp_path / "ds").exists()


def test_errors_in_transform_reach_the_caller_and_threads_stop(tmp_path: Path) -> None:
    converter = write_ids(tmp_path, 40)
    before = set(threading.enumerate())

    def explode(batch: dict) -> dict:
        raise ValueError("bad batch")

    with converter.make_torch_dataloader(4, transform=explode, cur_shard=0, shard_count=1) as dl:
        with pytest.raises(ValueError, match="bad batch"):
            next(iter(dl))
    # Leaving a pass early (break) closes it on exit.
    with converter.make_torch_dataloader(2, num_epochs=None, cur_shard=0, shard_count=1) as dl:
        for _ in dl:
            break
    # The loaders' own threads are gone (counted by name, not the process's total, which
    # another test's ending thread can lower meanwhile).
    assert [t.name for t in threading.enumerate() if t not in before] == []


def test_loader_never_imports_pyspark() -> None:
    code = (
        "import sys, sparktrain.data, sparktrain.data.loader\n"
        "assert 'pyspark' not in sys.modules, sorted(m for m in sys.modules if 'spark' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
