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
    from sparktrain.data.frame_loader import FrameLoader

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


class CountedStream:
    """A stand-in for a rank's stream: ``per_epoch`` batches (numbered) an epoch, its count
    known before the epoch from the second epoch on, as its spill makes it."""

    def __init__(self, per_epoch: int) -> None:
        self.per_epoch = per_epoch
        self.epoch = 0

    def batches_ahead(self) -> int | None:
        return None if self.epoch == 0 else self.per_epoch

    def __iter__(self) -> Any:
        return iter(range(self.per_epoch))


class Peer:
    """The other rank of two in the agreement (each call gives the MIN of both): it has
    ``per_epoch`` batches an epoch and, like this rank, knows that count from the second."""

    def __init__(self, stream: CountedStream, per_epoch: int) -> None:
        self.stream = stream
        self.per_epoch = per_epoch
        self.left = 0
        self.calls: list[int] = []

    def agree(self, mine: int) -> int:
        self.calls.append(mine)
        if self.stream.epoch > 0:  # both know their counts: the one agreement of the epoch
            return min(mine, self.per_epoch)
        if mine < 0:  # the first epoch's start: neither knows
            self.left = self.per_epoch
            return -1
        granted = min(mine, self.left)  # read ahead: as many as both have
        self.left -= granted
        return granted


def test_from_the_second_epoch_the_ranks_agree_once_on_the_counts_their_spills_give() -> None:
    from sparktrain.data.frame_loader import LOOKAHEAD, FrameLoader

    stream = CountedStream(20)
    peer = Peer(stream, 7)
    loader = FrameLoader(stream, num_epochs=3, agree=peer.agree)
    assert list(loader.next_epoch()) == list(range(7))  # the shorter share's count
    # Not known yet (-1), then once per LOOKAHEAD batches read ahead, until the peer has none.
    assert peer.calls == [-1, LOOKAHEAD, 20 - 7]
    for epoch in (1, 2):
        peer.calls.clear()
        assert list(loader.next_epoch()) == list(range(7))
        assert peer.calls == [20]  # one agreement, at the epoch's start: this rank's count
        assert (loader.epoch, loader.steps) == (epoch, 7)
    assert list(loader.next_epoch()) == []

    again = CountedStream(20)
    resumed = FrameLoader(again, num_epochs=3, agree=Peer(again, 7).agree)
    resumed.load_state_dict(place(world_size=1, steps=3))
    assert list(resumed.next_epoch()) == [3, 4, 5, 6]  # epoch 1's batches after the third
    assert resumed.state_dict()["steps"] == 7


def test_a_rank_that_cannot_count_ahead_keeps_every_rank_reading_ahead() -> None:
    from sparktrain.data.frame_loader import FrameLoader

    class Unknown(CountedStream):
        def batches_ahead(self) -> int | None:
            return None

    stream = Unknown(5)
    calls: list[int] = []

    def agree(mine: int) -> int:  # a peer that knows its count (9) where this rank does not
        calls.append(mine)
        return min(mine, 9)

    loader = FrameLoader(stream, num_epochs=2, agree=agree)
    list(loader.next_epoch())
    calls.clear()
    assert list(loader.next_epoch()) == list(range(5))
    assert calls == [-1, 5, 0]  # the MIN says one rank cannot count: all read ahead


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
