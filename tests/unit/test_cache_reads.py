"""A cached data set's part files are checked as the ranks read them, not only when the cache
is reused: a file swapped after the reuse check, or while a rank reads it, never reaches the
batches; the read fails naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparktrain.data import integrity, verified
from sparktrain.data.converter import _load_manifest
from sparktrain.data.dataset import MANIFEST_NAME, SparkDatasetConverter, filesystem
from sparktrain.errors import ConfigurationError

PART = "part-00000.parquet"


def _table(labels: list[int]) -> pa.Table:
    return pa.table({"x": [float(i) for i in range(len(labels))], "label": labels})


def _cache(root: Path, labels: list[int]) -> SparkDatasetConverter:
    """A cache as make_spark_converter leaves it, and the converter that reuses it."""
    root.mkdir()
    pq.write_table(_table(labels), root / PART)
    (root / PART).chmod(0o644)
    fresh = SparkDatasetConverter.from_parquet(f"file://{root}", files=[PART])
    fs, path = filesystem(fresh.url)
    digests = integrity.record(fs, path, [PART])
    (root / MANIFEST_NAME).write_text(json.dumps({**fresh.to_manifest(), integrity.KEY: digests}))
    reused = _load_manifest(fs, path, fresh.url, None)  # the reuse check: intact
    assert reused is not None and reused.digests == digests
    return reused


def _swap(target: Path, labels: list[int]) -> None:
    """Put another file of the same schema and size in ``target``'s place (a rename over it)."""
    other = target.with_name("swapped.tmp")
    pq.write_table(_table(labels), other)
    assert other.stat().st_size == target.stat().st_size  # only the hash tells
    os.replace(other, target)


def _loader(converter: SparkDatasetConverter) -> Any:
    return converter.make_torch_dataloader(
        2, num_epochs=1, shuffle=False, cur_shard=0, shard_count=1, read_ahead=False
    )


def _labels(batches: Any) -> list[int]:
    return [int(v) for batch in batches for v in batch["label"]]


def _refused(error: pytest.ExceptionInfo[ConfigurationError], converter: Any) -> None:
    message = str(error.value)
    assert f"the data cache {converter.url} was changed after it was written: {PART}" in message
    assert "its SHA-256 differs from the one recorded when written (found as a rank read it)" in (
        message
    )
    assert f"Delete {converter.url}" in message


def test_an_intact_cache_reads_its_rows_and_hashes_each_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    converter = _cache(tmp_path / "df-1", [0, 1, 0, 1, 1, 1])
    hashed: list[int] = []
    real = verified.sha256

    def counting(data: Any = b"") -> Any:
        hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(verified, "sha256", counting)
    with _loader(converter) as loader:
        first, second = _labels(loader), _labels(loader)
    assert first == second == [0, 1, 0, 1, 1, 1]
    # Mapped and hashed at its first opening; the next pass reopens the same file unhashed.
    assert hashed == [(tmp_path / "df-1" / PART).stat().st_size]


def test_a_file_swapped_after_the_reuse_check_fails_the_read_naming_it(tmp_path: Path) -> None:
    converter = _cache(tmp_path / "df-2", [0, 1, 0, 1])
    _swap(tmp_path / "df-2" / PART, [1, 0, 1, 0])
    with _loader(converter) as loader, pytest.raises(ConfigurationError) as error:
        _labels(loader)
    _refused(error, converter)


def test_a_file_swapped_while_a_rank_reads_it_never_reaches_the_batches(tmp_path: Path) -> None:
    converter = _cache(tmp_path / "df-3", [0, 1, 0, 1, 1, 1])
    with _loader(converter) as loader:
        batches = iter(loader)
        seen = _labels([next(batches)])  # the file is open (mapped) now
        _swap(tmp_path / "df-3" / PART, [1, 0, 1, 0, 0, 0])
        seen += _labels(batches)
        assert seen == [0, 1, 0, 1, 1, 1]  # the bytes that were hashed, to the end
        with pytest.raises(ConfigurationError) as error:
            _labels(loader)  # the next pass opens the name again: the swapped file
    _refused(error, converter)


def test_a_file_others_may_write_is_read_from_a_checked_copy(tmp_path: Path) -> None:
    converter = _cache(tmp_path / "df-4", [0, 1, 0, 1, 1, 1])
    part = tmp_path / "df-4" / PART
    part.chmod(0o666)  # another account could write it in place, under a rank's mapping
    flipped = tmp_path / "flipped.parquet"
    pq.write_table(_table([1, 0, 1, 0, 0, 0]), flipped)
    with _loader(converter) as loader:
        batches = iter(loader)
        seen = _labels([next(batches)])
        with part.open("r+b") as inplace:  # the same inode, rewritten
            inplace.write(flipped.read_bytes())
        seen += _labels(batches)
        assert seen == [0, 1, 0, 1, 1, 1]
        with pytest.raises(ConfigurationError) as error:
            _labels(loader)
    _refused(error, converter)


@pytest.mark.parametrize("planted", ["link", "fifo", "shorter"])
def test_a_link_a_fifo_or_a_file_of_another_size_in_its_place_is_refused(
    tmp_path: Path, planted: str
) -> None:
    converter = _cache(tmp_path / "df-5", [0, 1, 0, 1])
    part = tmp_path / "df-5" / PART
    size = part.stat().st_size
    aside = tmp_path / "aside.parquet"
    os.replace(part, aside)
    if planted == "link":
        part.symlink_to(aside)  # the very bytes written, but through a link
        why = "it cannot be opened"
    elif planted == "fifo":
        os.mkfifo(part)  # would hang a reader that waited for a writer
        why = "it is no longer a regular file"
    else:
        part.write_bytes(aside.read_bytes()[: size - 1])
        why = f"it has {size - 1} bytes, and {size} were written"
    with _loader(converter) as loader, pytest.raises(ConfigurationError) as error:
        _labels(loader)
    assert f"was changed after it was written: {PART}: {why}" in str(error.value)


def test_files_of_your_own_are_read_as_they_are(tmp_path: Path) -> None:
    (tmp_path / "own").mkdir()
    pq.write_table(_table([0, 1, 1, 0]), tmp_path / "own" / PART)
    converter = SparkDatasetConverter.from_parquet(f"file://{tmp_path / 'own'}")
    assert converter.digests is None  # nothing recorded, so nothing to check against
    _swap(tmp_path / "own" / PART, [1, 0, 0, 1])
    with _loader(converter) as loader:
        assert _labels(loader) == [1, 0, 0, 1]
