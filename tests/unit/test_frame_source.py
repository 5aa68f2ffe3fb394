"""from_dataframe's description: checked on the driver, carried without its DataFrame, and
refused where a run cannot read it, each before anything starts."""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle
import pytest

from sparktrain.data import DataFrameSource, from_dataframe
from sparktrain.driver.frame_input import frame_source
from sparktrain.errors import ConfigurationError


class Frame:
    """What from_dataframe reads of a DataFrame: its columns and schema."""

    def __init__(self) -> None:
        from pyspark.sql import types

        self.schema = types.StructType(
            [
                types.StructField("id", types.LongType()),
                types.StructField("price", types.DecimalType(5, 1)),
            ]
        )
        self.columns = ["id", "price"]

    def repartition(self, n: int) -> Frame:
        return self


def test_the_description_travels_without_its_dataframe() -> None:
    source = from_dataframe(Frame(), batch_size=4, columns=["id"], transform=lambda b: b)
    assert source.dataframe is not None
    back = pickle.loads(cloudpickle.dumps(source))
    assert isinstance(back, DataFrameSource) and back.dataframe is None
    assert back.columns == ("id",) and back.batch_size == 4
    with pytest.raises(ConfigurationError, match="holds none"):
        frame_source((back,), {})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1, not 0"),
        ({"batch_size": 2, "num_epochs": True}, "num_epochs must be an int >= 1, not True"),
        ({"batch_size": 2, "window": 0}, "window must be an int >= 1, not 0"),
        ({"batch_size": 2, "transform": 3}, "transform must be callable, not 3"),
        ({"batch_size": 2, "columns": ["id", "x"]}, r"columns \['x'\] are not in the DataFrame"),
        ({"batch_size": 2}, "column 'price' has type decimal"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        from_dataframe(Frame(), **kwargs)


def test_only_a_dataframe_is_taken() -> None:
    with pytest.raises(ConfigurationError, match="takes a Spark DataFrame, not list"):
        from_dataframe([1, 2], batch_size=2)


def test_one_dataframe_per_run() -> None:
    one = from_dataframe(Frame(), batch_size=2, columns=["id"])
    assert frame_source((1, one), {"x": 2}) is one
    assert frame_source((1,), {}) is None
    with pytest.raises(ConfigurationError, match="argument 1, data are each from_dataframe"):
        frame_source((0, one), {"data": one})


def test_the_loader_outside_a_run_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("_SPARKTRAIN_STREAM", raising=False)
    source = from_dataframe(Frame(), batch_size=2, columns=["id"])
    with pytest.raises(ConfigurationError, match=r"run\(train, data=from_dataframe"):
        with source.loader():
            pass


def place(world_size: int, steps: int) -> dict[str, Any]:
    return {
        "format": "sparktrain.data.from_dataframe/1",
        "epoch": 1,
        "steps": steps,
        "world_size": world_size,
    }


def test_a_place_mid_epoch_at_another_size_is_refused_unless_the_epoch_restarts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sparktrain.data.frame_source import FrameLoader

    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = FrameLoader(stream=None, num_epochs=3, agree=None)
    with pytest.raises(ConfigurationError) as refused:
        loader.load_state_dict(place(world_size=2, steps=5))
    message = str(refused.value)
    assert "saved by 2 ranks after 5 batches of epoch 1, and this run has 3" in message
    assert "restart_epoch=True" in message and "np=2" in message
    assert loader.epoch == 0  # nothing taken from the refused place

    loader.load_state_dict(place(world_size=2, steps=5), restart_epoch=True)
    assert (loader.epoch, loader._skip) == (1, 0)  # the saved epoch from its start

    at_start = FrameLoader(stream=None, num_epochs=3, agree=None)
    at_start.load_state_dict(place(world_size=2, steps=0))  # an epoch's start: any size
    assert (at_start.epoch, at_start._skip) == (1, 0)

    monkeypatch.setenv("WORLD_SIZE", "2")
    same = FrameLoader(stream=None, num_epochs=3, agree=None)
    same.load_state_dict(place(world_size=2, steps=5))
    assert (same.epoch, same._skip) == (1, 5)  # the same size goes on after 5 batches


def test_a_global_shuffle_needs_the_repartition() -> None:
    with pytest.raises(ConfigurationError, match="cannot go with repartition=False"):
        from_dataframe(Frame(), batch_size=2, global_shuffle=True, repartition=False)


def test_a_stage_over_the_frame_s_own_partitions_needs_a_count_of_them() -> None:
    from sparktrain.driver.frame_input import check_own_partitions

    with pytest.raises(ConfigurationError, match="this session cannot count before the run"):
        check_own_partitions(None, 2)  # a Spark Connect client
    for found in (3, 5):  # a barrier stage can neither merge nor split partitions
        with pytest.raises(ConfigurationError, match=f"it has {found} for 4 tasks"):
            check_own_partitions(found, 4)
    check_own_partitions(4, 4)
