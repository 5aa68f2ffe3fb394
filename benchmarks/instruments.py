"""What every benchmark here checks before it prints a ratio.

A ratio is only worth printing when both sides did the same work: the same values, the same
parameters within a tolerance, the same rows. When they did not, the benchmark stops with a
message and a non-zero exit status instead of printing a speed-up that measured something
else. And a launch measured "cold" must really be one: sparktrain's own record of the run
(``runner.last_run``) says whether rank 0 was forked from a warm zygote.

States, as the benchmarks name them:

* **cold**: the first call on fresh executors (or a fresh driver process): their Python
  workers not started yet, no zygote; rank 0 is a new interpreter.
* **warm**: a later call in the same session; rank 0 may be forked from a zygote (the
  benchmarks print how many were).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import Any, NoReturn


class WorkDiffers(SystemExit):
    """Raised (exit status 1) when the timed work was not the work the ratio compares."""

    def __init__(self, message: str) -> None:
        print(f"\nREFUSED: {message}", file=sys.stderr, flush=True)
        super().__init__(1)


def refuse(message: str) -> NoReturn:
    """Stop the benchmark: what it timed is not what it would report."""
    raise WorkDiffers(message)


def require(condition: bool, message: str) -> None:
    """Stop the benchmark with ``message`` unless ``condition`` holds."""
    if not condition:
        refuse(message)


def rank0_forked(runner: Any) -> bool | None:
    """Whether rank 0 of the runner's last run was forked from a zygote (None: not recorded)."""
    record = getattr(runner, "last_run", None)
    if record is None or not record.attempts:
        return None
    breakdown = record.attempts[-1].breakdown
    return bool(breakdown["forked"]) if "forked" in breakdown else None


def require_cold(runner: Any, what: str) -> None:
    """Refuse to call a run cold unless its record says rank 0 was a new interpreter."""
    forked = rank0_forked(runner)
    if forked is None:
        refuse(f"{what}: the run's record does not say how rank 0 started; cannot call it cold")
    if forked:
        refuse(f"{what}: rank 0 was forked from a warm zygote, so this run is not cold")


def close(a: Iterable[float], b: Iterable[float], rel: float, abs_: float = 0.0) -> bool:
    """Whether two equally long sequences of numbers agree within the tolerances."""
    first, second = list(a), list(b)
    return len(first) == len(second) and all(
        math.isclose(x, y, rel_tol=rel, abs_tol=abs_) for x, y in zip(first, second, strict=True)
    )
