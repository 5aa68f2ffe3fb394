"""make_spark_converter on a host shared with another account: the default cache is the user's
own, and a cache another account swapped a file of is refused, naming the file (both
writers, real local-cluster executors, a real second account)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from sparktrain.data import make_spark_converter
from sparktrain.data.dataset import MANIFEST_NAME
from sparktrain.errors import ConfigurationError
from tests.accounts import Account, account, shared_tmp

pytestmark = pytest.mark.spark


@pytest.fixture
def other() -> Iterator[Account]:
    with account() as found:
        yield found


def test_the_default_cache_is_in_the_users_private_folder(spark) -> None:
    df = spark.range(40).selectExpr("id", "id % 2 as label")
    converter = make_spark_converter(df)
    try:
        folder = Path(converter.url[len("file://") :]).parent
        assert folder.name == "cache" and folder.parent.name == f"sparktrain-{os.getuid()}"
        info = os.lstat(folder.parent)
        assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
        assert len(make_spark_converter(df)) == 40  # reused: its files are what was written
    finally:
        converter.delete()


@pytest.mark.parametrize("writer", ["spark", "tasks"])
def test_a_cache_file_another_account_swapped_is_refused(spark, other: Account, writer) -> None:
    df = spark.range(0, 40, 1, 2).selectExpr("id", "id % 2 as label")
    with shared_tmp() as tmp:
        # The other account makes the shared cache folder before the victim's first run.
        shared = tmp / "cache"
        other.run("mkdir", "-m", "0777", str(shared))
        converter = make_spark_converter(df, cache_dir=f"file://{shared}", writer=writer)
        assert make_spark_converter(df, cache_dir=f"file://{shared}", writer=writer).url == (
            converter.url
        )  # reused while intact
        key = Path(converter.url[len("file://") :])
        part = converter.files[0]
        # Flipped labels, as a Parquet file of the same schema.
        flipped = tmp / "flipped.parquet"
        table = pq.read_table(key / part)
        index = table.schema.get_field_index("label")
        table = table.set_column(index, "label", pc.subtract(1, table["label"]))
        pq.write_table(table, flipped)
        flipped.chmod(0o644)
        # It moves the victim's folder aside (the parent is its own) and puts in its place one
        # with the same manifest and the flipped part file.
        other.run("mv", str(key), str(shared / "aside"))
        other.run("cp", "-r", str(shared / "aside"), str(key))
        other.run("cp", str(flipped), str(key / part))
        assert (key / MANIFEST_NAME).read_bytes() == (shared / "aside" / MANIFEST_NAME).read_bytes()

        with pytest.raises(ConfigurationError) as info:
            make_spark_converter(df, cache_dir=f"file://{shared}", writer=writer)
        message = str(info.value)
        assert f"the data cache {converter.url} was changed after it was written: {part}" in message
        assert f"Delete {converter.url}" in message
