"""The driver's reader for np < 0 (a DataFrame as bounded Arrow batches, pulled lazily), and the
sweep of spills: a dead owner's spill goes, a living owner's and anything not a spill stay."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from sparktrain.data.stream import Spill, dataframe_batches, sweep
from sparktrain.data.stream.spill import SPILLS

CTX = multiprocessing.get_context("fork")


class Vector:
    """Stands in for pyspark.ml.linalg.DenseVector: what the reader sees of it is toArray."""

    def __init__(self, *values: float) -> None:
        self.values = values

    def toArray(self) -> np.ndarray:  # noqa: N802 (pyspark's name)
        return np.array(self.values)


class Frame:
    """A DataFrame as the reader uses it: its columns and toLocalIterator, counting rows pulled."""

    def __init__(self, count: int) -> None:
        self.columns = ["id", "features", "label"]
        self.count = count
        self.pulled = 0

    def toLocalIterator(self) -> Iterator[tuple[Any, ...]]:  # noqa: N802 (pyspark's name)
        for i in range(self.count):
            self.pulled += 1
            yield (i, Vector(i, -i), None if i == 0 else float(i))


def test_the_reader_yields_bounded_batches_as_it_pulls_rows() -> None:
    frame = Frame(10)
    batches = dataframe_batches(frame, rows=4)
    first = next(batches)
    assert frame.pulled == 4
    assert first.column("features").to_pylist()[1] == [1.0, -1.0]
    rest = list(batches)
    assert [b.num_rows for b in [first, *rest]] == [4, 4, 2]
    table = pa.Table.from_batches([first, *rest])
    assert table.column("id").to_pylist() == list(range(10))
    assert table.column("label").type == pa.float64()


def test_the_reader_refuses_an_empty_batch_size() -> None:
    with pytest.raises(ValueError, match="rows must be >= 1"):
        next(dataframe_batches(Frame(1), rows=0))


def hold_spill(local_dir: str, ready: Any, done: Any) -> None:
    spill = Spill(local_dir)
    spill.write(pa.RecordBatch.from_arrays([pa.array([1, 2])], ["x"]))
    ready.put(str(spill.folder))
    done.wait(60)


def test_the_sweep_takes_a_dead_owners_spill_only(tmp_path: Path) -> None:
    ready, done = CTX.Queue(), CTX.Event()
    alive = CTX.Process(target=hold_spill, args=(str(tmp_path), ready, done))
    doomed = CTX.Process(target=hold_spill, args=(str(tmp_path), ready, CTX.Event()))
    alive.start()
    living = Path(ready.get(timeout=60))
    doomed.start()
    dead = Path(ready.get(timeout=60))
    assert doomed.pid is not None
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(60)
    base = tmp_path / f"sparktrain-{os.getuid()}" / SPILLS
    (base / "notes").mkdir()
    (base / "spill-file").write_text("not a folder")
    try:
        assert sweep(base) == [dead]
        assert living.is_dir() and (base / "notes").is_dir() and (base / "spill-file").exists()
    finally:
        done.set()
        alive.join(60)
    # The living owner ended without closing (its process exited): now it is swept too.
    assert sweep(base) == [living]
