"""A restart that finds too few executors (a lost host not replaced) says what was lost and
how long it waited, instead of the bare capacity refusal of a first launch."""

from __future__ import annotations

from typing import Any

import pytest

from sparktrain.config import RunConfig
from sparktrain.driver import capacity
from sparktrain.driver.attempts import Attempts
from sparktrain.driver.places.classic import ClassicPlace
from sparktrain.driver.progress import Progress
from sparktrain.driver.run_record import RunRecord
from sparktrain.errors import CapacityError, WorkerFailedError, WorkerFailure
from sparktrain.task.assignment import TaskJob

REFUSAL = (
    "np=4 needs 4 task slots at once (barrier mode), but the cluster has 2 "
    "(spark.task.cpus=1, master spark://10.0.0.1:7077)."
)


class Context:
    """A SparkContext whose settings bound nothing (its slots are the tests' to say)."""

    master = "spark://test:7077"

    def getConf(self) -> dict[str, str]:  # noqa: N802 - Spark's name
        return {}


class Session:
    sparkContext: Any = Context()


def attempts(max_restarts: int) -> Attempts:
    config = RunConfig(np=4, max_restarts=max_restarts, capacity_wait=7)
    job = TaskJob(run_id="r1", attempt=0, config=config.to_json(), channel="", key=b"", payload=b"")
    return Attempts(
        ClassicPlace(Session()), config, job, "train", RunRecord(), Progress(display=False), None
    )


def lose_a_host(self: Attempts, job: TaskJob, attempt: Any) -> list[dict[str, Any]]:
    failure = WorkerFailure(
        rank=2, host="10.0.0.12", phase="lost", message="its Spark task vanished"
    )
    raise WorkerFailedError({2: failure})


def test_restart_without_the_lost_executors_names_them_and_capacity_wait(monkeypatch):
    calls: list[float | None] = []

    def check(
        sc: Any,
        n: int,
        wait: float,
        since: float | None = None,
        ranks_per_task: int = 1,
        held: int = 0,
    ) -> None:
        calls.append(since)
        if since is not None:  # the restart: the host's executors never came back
            raise CapacityError(REFUSAL)

    monkeypatch.setattr(capacity, "check_capacity", check)
    monkeypatch.setattr(Attempts, "_attempt", lose_a_host)
    run = attempts(max_restarts=1)
    with pytest.raises(CapacityError) as info:
        run.run()
    message = str(info.value)
    assert message.startswith(
        "attempt 2/2 could not start: the executors lost with attempt 1 (rank 2 on 10.0.0.12 "
        "was lost: its Spark task vanished) did not come back within capacity_wait=7s "
        "(spark.sparktrain.capacityWait)."
    ), message
    assert REFUSAL in message and "Raise capacity_wait" in message
    assert calls[0] is None and calls[1] is not None
    first, second = run.record.attempts
    assert "10.0.0.12" in first.cause
    assert second.cause is not None and second.cause.startswith("attempt 2/2 could not start")


def test_first_launch_refusal_is_unchanged(monkeypatch):
    def check(
        sc: Any,
        n: int,
        wait: float,
        since: float | None = None,
        ranks_per_task: int = 1,
        held: int = 0,
    ) -> None:
        raise CapacityError(REFUSAL)

    monkeypatch.setattr(capacity, "check_capacity", check)
    with pytest.raises(CapacityError) as info:
        attempts(max_restarts=1).run()
    assert str(info.value) == REFUSAL
