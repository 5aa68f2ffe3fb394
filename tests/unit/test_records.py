"""How a rank's end becomes its record: failed, stopped or ok."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparktrain.errors import WorkerFailure
from sparktrain.layout.cluster import TaskInfo, build_cluster_spec
from sparktrain.rank_outcome import RankOutcome, RankStatus
from sparktrain.task.rank_outcomes import rank_record


@pytest.fixture
def rank():
    return build_cluster_spec(
        [TaskInfo(index=0, host="h", port=1), TaskInfo(index=1, host="h", port=0)]
    ).ranks[1]


def write_error(workdir: Path, rank: int, time: float) -> None:
    (workdir / f"error-{rank}.json").write_text(
        json.dumps(
            {
                "exc_type": "RuntimeError",
                "message": "boom",
                "traceback": "Traceback...",
                "time": time,
                "phase": "run",
                "user_error": True,
            }
        )
    )


@pytest.mark.parametrize(
    "code, error, stopped, status",
    [
        (0, False, False, "ok"),
        (1, True, False, "failed"),
        (-9, False, False, "failed"),  # killed by something else
        (-15, False, True, "stopped"),  # our SIGTERM, nothing written
        (1, True, True, "failed"),  # it failed by itself while the stop arrived
    ],
)
def test_status(rank, tmp_path, code, error, stopped, status):
    if error:
        write_error(tmp_path, rank.rank, time=5.0)
    record = rank_record(rank, tmp_path, code, ["line"], end=9.0, stopped=stopped)
    assert record.status is RankStatus(status)
    if status == "failed" and error:
        assert record.failure is not None
        assert record.failure.time == 5.0  # the worker's own time, for root causes
        assert record.failure.exc_type == "RuntimeError"


def test_an_outcome_crosses_as_the_plain_dict_and_comes_back_whole() -> None:
    failure = WorkerFailure(rank=1, host="h", exit_code=-15, phase="stopped", message="m")
    outcome = RankOutcome(3, 1, RankStatus.STOPPED, failure=failure, times={"go": 1.0})
    wire_form = outcome.to_json()
    assert wire_form == {
        "index": 3,
        "rank": 1,
        "status": "stopped",
        "result": None,
        "failure": failure.to_json(),
        "times": {"go": 1.0},
    }
    assert RankOutcome.from_json(wire_form) == outcome


@pytest.mark.parametrize(
    "data, says",
    [
        ({"index": 0, "status": "ok"}, "without a rank"),
        ({"index": 0, "rank": 0, "status": "done"}, "'done' is not a valid RankStatus"),
        ({"index": 0, "rank": 0, "status": "failed", "failure": {"host": "h"}}, "without a rank"),
    ],
)
def test_an_outcome_that_is_not_one_is_refused(data: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        RankOutcome.from_json(data)
