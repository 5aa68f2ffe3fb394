"""Training curves from what the ranks sent with ``sparktrain.report``.

``runner.history`` is a list of report dicts
(``{"type": "report", "rank", "step", "epoch", "metrics": {...}}``), one per call on any rank.
:func:`plot_history` draws rank 0's metrics per epoch (or step) into a PNG;
:func:`history_frame` turns the list into a pandas DataFrame for your own plots.

Example:
    >>> runner = SparkRunner(np=2)
    >>> runner.run(train, epochs=5)
    >>> sparktrain.plot.plot_history(runner.history, "curves.png")
    'curves.png'
    >>> sparktrain.plot.history_frame(runner.history).query("rank == 0")
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["history_frame", "plot_history"]

_FIELDS = ("rank", "step", "epoch")


def history_frame(history: Any) -> Any:
    """``runner.history`` as a pandas DataFrame: one row per report, one column per metric.

    Args:
        history: the list of report dicts in ``runner.history`` (a DataFrame is returned
            as a copy).

    Returns:
        A DataFrame with columns ``rank``, ``step``, ``epoch``, then each metric.

    Raises:
        ImportError: pandas is not installed.

    Example:
        >>> df = history_frame(runner.history)
        >>> df[df["rank"] == 0].plot(x="epoch", y="loss")
    """
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("sparktrain.plot.history_frame needs pandas: pip install pandas") from exc
    if isinstance(history, pd.DataFrame):
        return history.copy()
    rows = _flatten(history)
    return pd.DataFrame(rows, columns=_columns(rows))


def plot_history(
    history: Any,
    path: str | os.PathLike[str],
    metrics: Sequence[str] | None = None,
    *,
    rank: int = 0,
    title: str | None = None,
) -> str:
    """Write a PNG of ``rank``'s metrics per epoch: one panel per metric.

    The x axis is the epoch where the reports carry one, else the step, else the order
    of the reports. Nothing global changes: no pyplot state, no backend switch.

    Args:
        history: ``runner.history`` (list of report dicts) or a DataFrame such as
            :func:`history_frame` returns (a ``rank`` column, metric columns).
        path: the PNG file to write; its folder is created.
        metrics: the metric names to draw, in order (default: every metric, losses first).
        rank: whose reports to draw (rank 0 by default; all ranks report the same in
            most training functions).
        title: a title over the panels.

    Returns:
        ``path`` as a string.

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: ``history`` has no reports from ``rank``, or lacks a metric asked for.

    Example:
        >>> plot_history(runner.history, "out/curves.png", metrics=["loss", "accuracy"])
        'out/curves.png'
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "sparktrain.plot.plot_history needs matplotlib: pip install matplotlib"
        ) from exc
    rows = [r for r in _flatten(history) if r.get("rank") in (None, rank)]
    if not rows:
        raise ValueError(f"the history has no reports from rank {rank}")
    present = [c for c in _columns(rows) if c not in _FIELDS]
    if metrics is None:
        names = sorted(present, key=lambda m: (0 if "loss" in m.lower() else 1, present.index(m)))
    else:
        names = list(metrics)
        missing = [m for m in names if m not in present]
        if missing:
            raise ValueError(
                f"metric(s) {missing} were not reported by rank {rank}; it reported {present}"
            )
    if not names:
        raise ValueError(f"rank {rank}'s reports carry no metrics")

    fig = Figure(figsize=(4.2 * len(names), 3.4), layout="constrained")
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, name in zip(axes, names, strict=True):
        xs, ys, label = _series(rows, name)
        ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, linewidth=1.8)
        ax.set_title(name)
        ax.set_xlabel(label)
        ax.grid(True, alpha=0.3)
        if label == "epoch" and len(xs) <= 20:
            ax.set_xticks(sorted(set(xs)))
    if title:
        fig.suptitle(title)
    out = os.fspath(path)
    folder = os.path.dirname(out)
    if folder:
        os.makedirs(folder, exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    return out


def _flatten(history: Any) -> list[dict[str, Any]]:
    """Report dicts (or DataFrame rows) as flat dicts: rank, step, epoch, then metrics."""
    if hasattr(history, "to_dict") and hasattr(history, "columns"):  # a DataFrame
        records: Iterable[Mapping[str, Any]] = history.to_dict("records")
    else:
        records = history
    flat = []
    for record in records:
        if record.get("type", "report") != "report":
            continue
        row = {k: _clean(record.get(k)) for k in _FIELDS}
        nested = record.get("metrics")
        if isinstance(nested, Mapping):
            row.update(nested)
        else:  # already flat (a DataFrame's row)
            row.update({k: v for k, v in record.items() if k not in (*_FIELDS, "type")})
        flat.append({k: v for k, v in row.items() if k in _FIELDS or _number(v) is not None})
    return flat


def _columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    names = list(_FIELDS)
    for row in rows:
        names.extend(k for k in row if k not in names)
    return names


def _clean(value: Any) -> Any:
    """None for missing values (a DataFrame's NaN), ints for whole numbers."""
    number = _number(value)
    if number is None:
        return None
    return int(number) if number.is_integer() else number


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _series(rows: Sequence[Mapping[str, Any]], name: str) -> tuple[list[float], list[float], str]:
    """The points of one metric, and the name of the x axis."""
    points = [r for r in rows if _number(r.get(name)) is not None]
    for axis in ("epoch", "step"):
        if points and all(r.get(axis) is not None for r in points):
            pairs = [(float(r[axis]), float(r[name])) for r in points]
            return [x for x, _ in pairs], [y for _, y in pairs], axis
    return [float(i) for i in range(len(points))], [float(r[name]) for r in points], "report"
