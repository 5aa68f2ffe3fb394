"""A rank's outcome: what its task tells the driver of how one rank ended.

The task side builds them (:mod:`sparktrain.task.rank_outcomes`) and the driver reads them
(:mod:`sparktrain.driver.outcome`, :mod:`sparktrain.driver.result_intake`); between the two
they travel as the plain dict of :meth:`RankOutcome.to_json` (in a Spark job's output, or a
Connect stage's pickled rows), so that what crosses the process boundary is plain data.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from sparktrain.errors import WorkerFailure


class RankStatus(str, enum.Enum):
    """How a rank ended."""

    OK = "ok"
    """It returned (and, where its value is asked for, wrote it)."""
    FAILED = "failed"
    """It failed by itself: its own error, a crash, or no result where one was asked for."""
    STOPPED = "stopped"
    """It was stopped (the run's deadline, a stall, another rank's failure, Ctrl-C)."""


@dataclasses.dataclass
class RankOutcome:
    """How one rank ended.

    Attributes:
        index: the index of the task that ran it (-1 where the driver made the record up from
            a job's error, with no task's word).
        rank: the rank.
        status: how it ended.
        result: its pickled value (rank 0's, or every rank's for ``run_all``) while carried
            with the record; the driver lets go of it once loaded.
        failure: why it failed or where it was stopped (None when it returned).
        times: when its launch reached each step, on its host (see
            :func:`sparktrain.task.rank_outcomes.launch_times`), where known.
        result_sent: the size of a result sent to the driver over the channel instead of
            carried (``result`` is then None until the driver attaches it).
    """

    index: int
    rank: int
    status: RankStatus
    result: bytes | bytearray | None = None
    failure: WorkerFailure | None = None
    times: dict[str, Any] | None = None
    result_sent: int | None = None

    @property
    def ok(self) -> bool:
        return self.status is RankStatus.OK

    def to_json(self) -> dict[str, Any]:
        """The plain dict that crosses to the driver (``result`` stays bytes)."""
        data: dict[str, Any] = {
            "index": self.index,
            "rank": self.rank,
            "status": self.status.value,
            "result": self.result,
            "failure": self.failure.to_json() if self.failure is not None else None,
        }
        if self.times is not None:
            data["times"] = self.times
        if self.result_sent is not None:
            data["result_sent"] = self.result_sent
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RankOutcome:
        """Rebuild an outcome from :meth:`to_json` output.

        Raises:
            ValueError: ``rank`` is missing or not an int, ``status`` is none of
                :class:`RankStatus`, or ``failure`` is not a failure record.
        """
        rank = data.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise ValueError(f"rank outcome without a rank: {dict(data)!r:.200}")
        failure = data.get("failure")
        times = data.get("times")
        return cls(
            index=int(data.get("index", -1)),
            rank=rank,
            status=RankStatus(data.get("status")),
            result=data.get("result"),
            failure=WorkerFailure.from_json(failure) if failure else None,
            times=dict(times) if times is not None else None,
            result_sent=data.get("result_sent"),
        )
