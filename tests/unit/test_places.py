"""Where a run goes: each place answers for itself (conf, turns, address, first-stage checks),
and what a Connect session's first stage teaches holds for the runner's later runs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sparktrain.config import RunConfig
from sparktrain.driver import places
from sparktrain.driver.connect_check import ClientUnreachable, ConnectPlan
from sparktrain.driver.places import is_connect, place_for
from sparktrain.driver.places.classic import ClassicPlace
from sparktrain.driver.places.connect import ConnectPlace
from sparktrain.driver.places.local import LocalPlace
from sparktrain.errors import ConfigurationError


class Conf(dict):
    def getAll(self) -> list[tuple[str, str]]:  # noqa: N802 - Spark's name
        return list(self.items())


class Context:
    master = "local[2]"
    applicationId = "app-1"  # noqa: N815 - Spark's name

    def __init__(self, conf: dict[str, str]) -> None:
        self.conf = Conf(conf)

    def getConf(self) -> Conf:  # noqa: N802 - Spark's name
        return self.conf


class ClassicSession:
    def __init__(self, conf: dict[str, str] | None = None) -> None:
        self.sparkContext = Context(conf or {})


class Frame:
    """A DataFrame as a place checks it: its session, and mapInArrow's signature."""

    def __init__(self, session: Any) -> None:
        self.sparkSession = session

    def mapInArrow(self, func: Any, schema: Any, barrier: bool = False) -> None:  # noqa: N802
        raise AssertionError("never called by a check")


def test_each_session_gets_its_place() -> None:
    assert isinstance(place_for(None), LocalPlace)
    assert isinstance(place_for(ClassicSession()), ClassicPlace)
    connect = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})()
    assert is_connect(connect) and isinstance(place_for(connect, {}), ConnectPlace)


def test_a_classic_place_reads_its_conf_and_channel_address() -> None:
    session = ClassicSession(
        {"spark.sparktrain.maxRestarts": "2", "spark.driver.host": "192.0.2.10", "x": "y"}
    )
    place = place_for(session)
    assert place.spark_settings(place.conf()) == {"spark.sparktrain.maxRestarts": "2"}
    # spark.driver.host is not this machine's: the channel listens where Spark's driver does.
    assert place.channel_address() == ("0.0.0.0", "192.0.2.10")
    assert place_for(None).channel_address() == ("127.0.0.1", "127.0.0.1")
    assert place_for(None).spark_settings(None) is None  # the driver's processes: no conf


def test_a_dataframe_of_the_other_kind_of_session_is_refused() -> None:
    connect_place = ConnectPlace(SimpleNamespace(session_id="s1"), {})
    with pytest.raises(ConfigurationError, match="belongs to a classic session, but the run "
                       "goes to a Spark Connect one"):  # fmt: skip
        connect_place.check_frame(Frame(ClassicSession()))
    place_for(ClassicSession()).check_frame(Frame(ClassicSession()))  # the same kind: fine
    place_for(None).check_frame(object())  # the driver reads any DataFrame itself


def test_a_pyspark_without_barrier_map_in_arrow_is_refused() -> None:
    class OldFrame(Frame):
        def mapInArrow(self, func: Any, schema: Any) -> None:  # noqa: N802
            raise AssertionError("never called by a check")

    with pytest.raises(ConfigurationError, match="PySpark 3.5 and later"):
        place_for(ClassicSession()).check_frame(OldFrame(ClassicSession()))


def test_what_a_connect_session_s_first_stage_teaches_holds_for_later_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    planned: list[str] = []

    def plan(session: Any, config: RunConfig, per_task: int) -> ConnectPlan:
        planned.append(session.session_id)
        return ConnectPlan(address="192.0.2.5", reachable=True, slots=None)

    monkeypatch.setattr(places.connect, "plan_connect", plan)
    session, plans = SimpleNamespace(session_id="s1"), {}
    config = RunConfig(np=2)
    first = ConnectPlace(session, plans)
    first.prepare(config, 1)
    assert first.checking and not first.detached
    assert first.turn() is None  # the conf says no slots: launch at once, Spark's barrier waits
    assert first.channel_address() == ("0.0.0.0", "192.0.2.5")
    first.passed_checks()

    later = ConnectPlace(session, plans)
    later.prepare(config, 1)
    assert planned == ["s1"]  # planned once for the session
    assert not later.checking  # a stage passed the checks: later runs need not check

    later.detach(config, ClientUnreachable("connection refused"))
    assert ConnectPlace(session, plans).detached  # the session's next runs go detached too
    with pytest.raises(ValueError, match="not an unreachable client"):
        later.detach(config, ValueError("not an unreachable client"))


def test_a_connect_place_takes_turns_within_the_slots_its_conf_promises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        places.connect,
        "plan_connect",
        lambda session, config, per_task: ConnectPlan(address="::1", reachable=True, slots=4),
    )
    session = SimpleNamespace(session_id="s2", client=None)
    place = ConnectPlace(session, {})
    place.prepare(RunConfig(np=2), 1)
    turn = place.turn()
    assert turn is not None and turn.total() == 4 and turn.most == 4
    assert turn.application == "connect:s2"  # no server address known: the session's own
    assert place.channel_address() == ("::1", "::1")  # this machine's: listened on alone
