"""The rank's side of a task's stream (sparktrain.data.stream): batches re-cut to batch_size,
the column rules of make_torch_dataloader, a seeded within-partition shuffle that differs by
epoch, epochs after the first read from a spill that is removed on close, and a full spill disk
named with the bytes it needs."""

from __future__ import annotations

import contextlib
import multiprocessing
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from sparktrain.data.stream import Feeder, RankStream, Spill, StreamError, rows
from sparktrain.errors import ConfigurationError

KEY = b"q" * 32
CTX = multiprocessing.get_context("fork")


def id_batches(sizes: list[int]) -> list[pa.RecordBatch]:
    out, start = [], 0
    for size in sizes:
        ids = np.arange(start, start + size)
        out.append(
            pa.RecordBatch.from_arrays(
                [pa.array(ids), pa.array(ids * 0.5), pa.array([b"%d" % i for i in ids])],
                ["id", "x", "raw"],
            )
        )
        start += size
    return out


def ids_of(tables: Iterator[pa.Table]) -> list[list[int]]:
    return [t.column("id").to_pylist() for t in tables]


def test_cut_recuts_across_incoming_batches_and_keeps_or_drops_the_short_last() -> None:
    tables = [pa.Table.from_batches([b]) for b in id_batches([3, 0, 5, 1])]
    assert ids_of(rows.cut(tables, 4, drop_last=False)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert ids_of(rows.cut(tables, 4, drop_last=True)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ids_of(rows.cut(tables, 20, drop_last=True)) == []


def shuffled_ids(seed: int, epoch: int, buffer_rows: int) -> list[int]:
    rng = np.random.default_rng([seed, epoch])
    tables = rows.shuffled(id_batches([7, 3, 9, 4, 11]), buffer_rows, rng)
    return [i for t in tables for i in t.column("id").to_pylist()]


def test_the_shuffle_is_seeded_by_epoch_and_keeps_every_row() -> None:
    first = shuffled_ids(7, 0, 6)
    assert sorted(first) == list(range(34))
    assert first != list(range(34))
    assert shuffled_ids(7, 0, 6) == first
    assert shuffled_ids(7, 1, 6) != first
    assert shuffled_ids(8, 0, 6) != first
    assert shuffled_ids(7, 0, 0) == list(range(34))


def test_columns_follow_the_loaders_rules() -> None:
    vectors = pa.array(
        [
            {"type": 1, "size": None, "indices": None, "values": [1.0, 2.0, 3.0]},
            {"type": 0, "size": 3, "indices": [2], "values": [9.0]},
        ]
    )
    table = pa.table(
        {
            "label": pa.array([1, 0], pa.int32()),
            "arr": pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32())),
            "vec": vectors,
            "raw": pa.array([b"a", b"b"]),
        }
    )
    batch = rows.to_tensors(table, rows.plan(table.schema, None))
    assert batch["label"].shape == (2,) and batch["label"].dtype == torch.int32
    assert batch["arr"].shape == (2, 2)
    assert batch["vec"].tolist() == [[1.0, 2.0, 3.0], [0.0, 0.0, 9.0]]
    assert batch["raw"] == [b"a", b"b"]
    assert set(rows.to_tensors(table, rows.plan(table.schema, ["raw"]))) == {"raw"}
    with pytest.raises(ConfigurationError, match=r"names \['nope'\].*'label', 'arr'"):
        rows.plan(table.schema, ["label", "nope"])
    when = pa.schema([pa.field("when", pa.timestamp("us"))])
    with pytest.raises(ConfigurationError, match="column 'when' has type timestamp"):
        rows.plan(when, None)


def epochs_rank(address: str, out: Any, spill_dir: str, seed: int, leave_early: bool) -> None:
    """A rank reading three epochs; reports each epoch's ids and where its spill was."""
    try:
        with RankStream(
            address,
            0,
            4,
            key=KEY,
            shuffle_buffer=5,
            seed=seed,
            columns=["id", "raw"],
            transform=lambda b: (b["id"], b["raw"]),
            local_dir=spill_dir,
        ) as loader:
            epochs: list[list[int]] = []
            for _ in range(3):
                ids: list[int] = []
                for i, (tensor, raw) in enumerate(loader):
                    assert [b"%d" % v for v in tensor.tolist()] == raw
                    ids += tensor.tolist()
                    if leave_early and len(epochs) == 0 and i == 0:
                        break
                epochs.append(ids)
            spill = loader._spill.folder if loader._spill is not None else None
            during = spill is not None and (spill / "epoch.arrow").is_file()
        out.put(("ok", epochs, during, spill is not None and spill.exists()))
    except Exception as exc:  # reported to the test, which shows it
        out.put(("error", repr(exc), False, False))


def run_epochs(tmp_path: Path, seed: int, leave_early: bool = False) -> tuple[Any, ...]:
    out = CTX.Queue()
    with Feeder(1, KEY, parent=tmp_path) as feeder:
        rank = CTX.Process(
            target=epochs_rank, args=(feeder.address, out, str(tmp_path), seed, leave_early)
        )
        rank.start()
        feeder.feed(iter(id_batches([6, 2, 9, 5])))
        result = out.get(timeout=60)
    rank.join(60)
    assert result[0] == "ok", result[1]
    return tuple(result[1:])


def test_later_epochs_read_the_spill_in_a_new_order_the_same_for_the_same_seed(
    tmp_path: Path,
) -> None:
    epochs, spilled, left = run_epochs(tmp_path, seed=3)
    assert spilled and not left
    assert [sorted(e) for e in epochs] == [list(range(22))] * 3
    assert len({tuple(e) for e in epochs}) == 3
    assert run_epochs(tmp_path, seed=3)[0] == epochs
    assert run_epochs(tmp_path, seed=4)[0] != epochs


def test_an_epoch_left_early_still_spills_the_whole_stream(tmp_path: Path) -> None:
    epochs, _, left = run_epochs(tmp_path, seed=3, leave_early=True)
    assert len(epochs[0]) == 4
    assert [sorted(e) for e in epochs[1:]] == [list(range(22))] * 2
    assert not left


def counting_rank(address: str, out: Any, spill_dir: str, drop_last: bool) -> None:
    """A rank that leaves its first epoch after one batch, then asks how many batches the
    second gives before reading it."""
    try:
        with RankStream(address, 0, 4, key=KEY, drop_last=drop_last, local_dir=spill_dir) as loader:
            before = loader.batches_ahead()
            for _ in loader:
                break
            ahead = loader.batches_ahead()
            read = len(list(loader))
        out.put(("ok", before, ahead, read))
    except Exception as exc:  # reported to the test, which shows it
        out.put(("error", repr(exc), None, None))


@pytest.mark.parametrize(("drop_last", "batches"), [(False, 6), (True, 5)])
def test_from_the_second_epoch_a_rank_knows_its_batches_before_reading_them(
    tmp_path: Path, drop_last: bool, batches: int
) -> None:
    out = CTX.Queue()
    with Feeder(1, KEY, parent=tmp_path) as feeder:
        rank = CTX.Process(
            target=counting_rank, args=(feeder.address, out, str(tmp_path), drop_last)
        )
        rank.start()
        feeder.feed(iter(id_batches([6, 2, 9, 5])))  # 22 rows: 5 batches of 4 and 2 left
        result = out.get(timeout=60)
    rank.join(60)
    assert result[0] == "ok", result[1]
    # Unknown while the first epoch streams; then the spill's rows, read to their end first.
    assert result[1:] == (None, batches, batches)


def test_a_second_epoch_without_a_spill_says_how(tmp_path: Path) -> None:
    with Feeder(1, KEY, parent=tmp_path) as feeder:
        ctx_out = CTX.Queue()

        def rank() -> None:
            with RankStream(feeder.address, 0, 2, key=KEY, spill=False) as loader:
                list(loader)
                try:
                    list(loader)
                except StreamError as exc:
                    ctx_out.put(str(exc))

        process = CTX.Process(target=rank)
        process.start()
        feeder.feed(iter(id_batches([3])))
        assert "open the loader with spill=True" in ctx_out.get(timeout=60)
    process.join(60)


@contextlib.contextmanager
def tiny_disk(path: Path) -> Iterator[Path]:
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(
            f"a full disk needs a small tmpfs, which this host cannot mount: {mounted.stderr}"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_a_full_spill_disk_names_the_folder_and_the_bytes(tmp_path: Path) -> None:
    with tiny_disk(tmp_path / "disk") as disk:
        spill = Spill(disk)
        try:
            big = pa.RecordBatch.from_arrays([pa.array(np.zeros(4096))], ["x"])
            with pytest.raises(StreamError) as caught:
                for _ in range(64):
                    spill.write(big)
                spill.finish()
            message = str(caught.value)
            assert f"the disk of {spill.folder} is full" in message
            assert f"at least {big.nbytes} more bytes" in message
        finally:
            spill.close()
        assert not spill.folder.exists()
