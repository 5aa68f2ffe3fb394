"""``gpu_suite.py``'s results: one row list with ratios and targets, as JSON and Markdown.

A row's ratio is sparktrain's figure over the peer's (for seconds, above 1 is slower; for
samples or rows a second, above 1 is faster). A target is met or not only where its figures
exist; a row without figures says why (``skip``), and a case that failed or ran past its
deadline is one row saying so.
"""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path
from typing import Any

COLUMNS = ("case", "measure", "sparktrain", "plain / peer", "ratio", "target", "met?", "notes")


def _met(row: dict[str, Any]) -> bool | None:
    goal, ours, ratio = row.get("target"), row.get("sparktrain"), row.get("ratio")
    if goal is None or ours is None:
        return None
    kind, value = goal["kind"], goal["value"]
    if kind == "value<=":
        return bool(ours <= value)
    if ratio is None:
        return None
    return bool(ratio <= value) if kind == "ratio<=" else bool(ratio >= value)


def _ratio(ours: float | None, peer: float | None) -> float | None:
    if ours is None or peer is None or not peer or math.isnan(ours) or math.isnan(peer):
        return None
    return ours / peer


def assemble(cases: dict[str, dict[str, Any]], dry: bool, wall: float) -> dict[str, Any]:
    """The results: environment, every case's record, and the rows of the table."""
    rows: list[dict[str, Any]] = []
    environment: dict[str, Any] = {}
    for name, case in cases.items():
        environment = environment or case.get("environment", {})
        if case["status"] != "ok":
            reason = f"{case['status']}: {case.get('error', '')}".strip(": ")
            rows.append({"case": name, "row": "(the whole case)", "sparktrain": None,
                         "peer": None, "peer_name": "", "target": None, "note": "",
                         "skip": reason})  # fmt: skip
            continue
        for row in case["rows"]:
            row = {"case": name, **row}
            row["ratio"] = _ratio(row["sparktrain"], row["peer"])
            row["met"] = _met(row)
            rows.append(row)
    for row in rows:
        row.setdefault("ratio", None)
        row.setdefault("met", None)
    return {
        "suite": "sparktrain GPU suite (benchmarks/gpu_suite.py)",
        "dry_run": dry,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": wall,
        "environment": environment,
        "cases": cases,
        "rows": rows,
    }


def _number(value: float | None) -> str:
    if value is None:
        return "—"
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _cells(row: dict[str, Any]) -> list[str]:
    met = {True: "yes", False: "**no**", None: "—"}[row["met"]]
    if row.get("skip"):
        met, note = "skipped", row["skip"]
    else:
        note = "; ".join(x for x in (f"peer: {row['peer_name']}", row.get("note")) if x)
    ratio = "—" if row["ratio"] is None else f"{row['ratio']:.2f}x"
    goal = row["target"]["text"] if row.get("target") else "—"
    figures = [_number(row["sparktrain"]), _number(row["peer"])]
    return [row["case"], row["row"], *figures, ratio, goal, met, note.replace("|", "/")]


def markdown(results: dict[str, Any]) -> str:
    """The table, with a line saying where and when it was measured."""
    env = results["environment"]
    head = (
        f"{env.get('device', 'unknown device')}, torch {env.get('torch')}, CUDA "
        f"{env.get('cuda')}, sparktrain {env.get('sparktrain')}, Python {env.get('python')}; "
        f"{'dry run; ' if results['dry_run'] else ''}{results['finished']}; "
        f"the suite took {results['wall_s']:.0f} s"
    )
    lines = [head, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in results["rows"]]
    return "\n".join(lines) + "\n"


def write(results: dict[str, Any], folder: Path) -> None:
    """``results.json`` and ``results.md`` under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (folder / "results.md").write_text(markdown(results))
