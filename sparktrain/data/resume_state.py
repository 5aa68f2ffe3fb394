"""The saved place of a loader or sampler in its epochs: small dicts of plain values.

A *shard state* is what one rank's ``state_dict()`` returns: the epoch in progress, its
finished stages (see :mod:`sparktrain.data.resharding`), the current stage's shard count, this
rank's shard and the rows it has served in the stage. A *merged state* joins the shard states
of all ranks of one stage into the epoch's global place (its stages, with the current one
finished), which any number of ranks can take up. Both hold only ints, bools, strings, lists
and dicts, so ``torch.load(weights_only=True)`` reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparktrain.data.resharding import Stage, StagePlan
from sparktrain.errors import ConfigurationError

FORMAT = 1
SHARD = "shard"
MERGED = "merged"


def shard_state(
    config: Mapping[str, Any],
    *,
    epoch: int,
    stages: Sequence[Stage],
    shard_count: int,
    shard: int,
    rows: int,
    end: int | None,
) -> dict[str, Any]:
    """One rank's state (see the module docstring)."""
    return {
        "format": FORMAT,
        "kind": SHARD,
        "config": dict(config),
        "epoch": epoch,
        "stages": [[count, list(served)] for count, served in stages],
        "shard_count": shard_count,
        "shard": shard,
        "rows": rows,
        "end": end,
    }


def stages_of(state: Mapping[str, Any]) -> list[Stage]:
    """The finished stages of a state, as tuples.

    Raises:
        ConfigurationError: the stages are malformed (a damaged or hand-made state).
    """
    stages: list[Stage] = []
    try:
        for count, served in state["stages"]:
            stage = (_natural(count), tuple(_natural(rows) for rows in served))
            if stage[0] < 1 or len(stage[1]) != stage[0]:
                raise ValueError(stage)
            stages.append(stage)
        for key in ("epoch", "rows"):
            if key in state:
                _natural(state[key])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"the loader state is damaged (its stages or counts do not add up: {exc!r}); "
            f"pass what state_dict() returned or the 'loader' entry of a checkpoint"
        ) from exc
    return stages


def _natural(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(value)
    return value


def merge(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Join the shard states of every rank of one stage (or pass one merged state through).

    Raises:
        ConfigurationError: the states are not one complete set from one loader at one step.
    """
    states = [_checked(state) for state in states]
    if not states:
        raise ConfigurationError("no loader state to restore; pass the states of all ranks")
    if len(states) == 1 and states[0]["kind"] == MERGED:
        return dict(states[0])
    if any(state["kind"] != SHARD for state in states):
        raise ConfigurationError(
            "a merged loader state cannot be joined with others; pass it alone"
        )
    first = states[0]
    for state in states[1:]:
        for key in ("config", "epoch", "stages", "shard_count", "end"):
            if state[key] != first[key]:
                raise ConfigurationError(
                    f"the loader states do not come from one loader at one step ({key} "
                    f"differs: {first[key]!r} and {state[key]!r}); save the states of all "
                    f"ranks at the same step"
                )
    count = first["shard_count"]
    shards = sorted(state["shard"] for state in states)
    if shards != list(range(count)):
        raise ConfigurationError(
            f"the loader states cover shards {shards} of {count}; pass the state of every "
            f"rank (sparktrain.checkpoint.save(..., loader=loader) gathers them)"
        )
    served = [0] * count
    for state in states:
        served[state["shard"]] = state["rows"]
    stages = [list(stage) for stage in first["stages"]]
    if any(served):
        stages.append([count, served])
    return {
        "format": FORMAT,
        "kind": MERGED,
        "config": dict(first["config"]),
        "epoch": first["epoch"],
        "stages": stages,
        "end": first["end"],
    }


def check_config(state: Mapping[str, Any], config: Mapping[str, Any], what: str) -> None:
    """Refuse a state made by a loader that reads other data, or in another order."""
    saved = state["config"]
    if dict(saved) != dict(config):
        diff = ", ".join(
            f"{key}: saved {saved.get(key)!r}, now {config.get(key)!r}"
            for key in sorted(set(saved) | set(config))
            if saved.get(key) != config.get(key)
        )
        raise ConfigurationError(
            f"this {what} state was saved by one with other settings or data ({diff}); make "
            f"the {what} with the saved settings over the same data to resume it"
        )


def _checked(state: object) -> dict[str, Any]:
    if (
        not isinstance(state, Mapping)
        or state.get("format") != FORMAT
        or state.get("kind") not in (SHARD, MERGED)
    ):
        raise ConfigurationError(
            f"not a sparktrain loader state (format {FORMAT}): {type(state).__name__}; pass "
            f"what loader.state_dict() returned, a list of them from every rank, or the "
            f"'loader' entry of a checkpoint saved with loader="
        )
    return dict(state)


def as_states(state: object) -> list[Mapping[str, Any]]:
    """A state, or a list of them, as a list."""
    if isinstance(state, Mapping):
        return [state]
    if isinstance(state, (list, tuple)):
        return list(state)
    return [_checked(state)]  # raises with the message above


class Cursor:
    """Where one rank's pass stands: the epoch, its finished stages, the stage's plan, rows.

    Args:
        plan_for: the rank's plan of an epoch after the given finished stages.
        epoch: the epoch the pass is in.
        stages: that epoch's finished stages.
        skip: rows of the current stage this rank served before the pass started.
        end: the epoch the pass stops before (None: endless).
        batch_size: rows per batch (1 for a sampler).
    """

    def __init__(
        self,
        plan_for: Callable[[int, Sequence[Stage]], StagePlan],
        *,
        epoch: int,
        stages: Sequence[Stage],
        skip: int,
        end: int | None,
        batch_size: int,
    ) -> None:
        self._plan_for = plan_for
        self._batch_size = batch_size
        self.end = end
        self._enter(epoch, stages, skip)
        while self.left() == 0 and (end is None or self.epoch < end):
            self._enter(self.epoch + 1, (), 0)  # nothing left of a resumed epoch

    def _enter(self, epoch: int, stages: Sequence[Stage], skip: int) -> None:
        self.epoch, self.stages, self.skip = epoch, list(stages), skip
        self.plan = self._plan_for(epoch, self.stages)
        self.batches = 0

    def left(self) -> int:
        """Batches of the current epoch this rank has still to serve."""
        return self.plan.batches - self.skip // self._batch_size - self.batches

    def served_batch(self) -> None:
        """Count one batch handed to the caller; past the epoch's last, go to the next."""
        self.advance(1)

    def advance(self, batches: int) -> None:
        """Count ``batches`` batches handed to the caller (within the current epoch)."""
        self.batches += batches
        if self.left() <= 0:
            self._enter(self.epoch + 1, (), 0)

    def rows(self) -> int:
        """Rows of the current stage this rank has served."""
        return min(self.skip + self.batches * self._batch_size, self.plan.rows)

    def state(self, config: Mapping[str, Any], shard_count: int, shard: int) -> dict[str, Any]:
        """This rank's state (see :func:`shard_state`)."""
        return shard_state(
            config,
            epoch=self.epoch,
            stages=self.stages,
            shard_count=shard_count,
            shard=shard,
            rows=self.rows(),
            end=self.end,
        )


def pending(
    state: object, *, config: Mapping[str, Any], shard_count: int, shard: int, what: str
) -> tuple[int, list[Stage], int, int | None]:
    """What a restored state means for this rank's next pass: ``(epoch, stages, skip, end)``.

    One rank's own state (same shard count and shard) resumes that rank where it was; a
    merged state, or the states of every rank of a stage, resume the epoch's rest split among
    ``shard_count`` ranks.

    Raises:
        ConfigurationError: the state is not a loader state, was made with other settings, or
            is another rank's alone.
    """
    states = as_states(state)
    if len(states) == 1 and _checked(states[0])["kind"] == SHARD:
        own = _checked(states[0])
        check_config(own, config, what)
        if own["shard_count"] == shard_count and own["shard"] == shard:
            return own["epoch"], stages_of(own), own["rows"], own["end"]
        raise ConfigurationError(
            f"this {what} state is shard {own['shard']} of {own['shard_count']} alone, but "
            f"this rank is shard {shard} of {shard_count}; to resume at another size or rank, "
            f"pass the states of all {own['shard_count']} ranks (a list) or their merged "
            f"state (sparktrain.checkpoint.save(..., loader=...) saves it)"
        )
    merged = merge(states)
    check_config(merged, config, what)
    return merged["epoch"], stages_of(merged), 0, merged["end"]
