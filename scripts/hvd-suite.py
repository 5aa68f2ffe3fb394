#!/usr/bin/env python
"""Run Horovod's own PyTorch tests on sparktrain's built-in horovod.torch (and on Horovod).

Given a checkout of Horovod (``--horovod-src``, v0.28.1: ``git clone --branch v0.28.1
https://github.com/horovod/horovod``), this runs its ``test/parallel/test_torch.py`` through
``HorovodRunner(np=-N)`` (N ranks on this machine, no Spark job), once on the built-in
implementation (``horovod_impl="builtin"``) and, where Horovod is installed, once on the real
one (``horovod_impl="horovod"``), and prints a table of each test's outcome side by side:

    pass   passed on every rank
    skip   skipped on every rank (the test's own skip, e.g. GPU-only)
    FAIL   failed or errored on some rank
    HANG   did not finish within --timeout (the run was stopped)
    CRASH  a rank died (exit code or signal) without pytest's outcome

By default each test gets its own launch (init and shutdown once per test); ``--one-session``
runs every test in one launch per implementation, as Horovod's CI does (then --timeout is for
the whole session, and a hang leaves the tests after it as HANG).

Examples:
    python scripts/hvd-suite.py --horovod-src /tmp/horovod --np 2 3
    python scripts/hvd-suite.py --horovod-src /tmp/horovod --np 2 -k process_sets --impl builtin
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SUITE = Path("test") / "parallel" / "test_torch.py"
CLASS = "TorchTests"
OUTCOMES = ("pass", "skip", "FAIL", "HANG", "CRASH")


def test_names(test_file: Path) -> list[str]:
    """The test methods of ``TorchTests`` in ``test_file``, in file order (read, not imported:
    importing it needs a horovod.torch)."""
    tree = ast.parse(test_file.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == CLASS:
            return [
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test_")
            ]
    raise SystemExit(
        f"{test_file} has no class {CLASS}: is it Horovod's test/parallel/test_torch.py?"
    )


def run_tests_on_rank(test_file: str, names: list[str], out_dir: str) -> int:
    """On each rank: run ``names`` with pytest, writing each outcome to this rank's file in
    ``out_dir`` as it is known (so a hang or a crash keeps what finished before it)."""
    import json
    import os

    import pytest

    _provide_test_imports()
    rank = os.environ.get("HOROVOD_RANK") or os.environ.get("RANK") or "0"
    path = os.path.join(out_dir, f"rank-{rank}.json")
    outcomes: dict[str, str] = {}

    class Recorder:
        def pytest_runtest_logreport(self, report: Any) -> None:
            name = report.nodeid.rsplit("::", 1)[-1]
            if report.skipped:
                outcome = "skip"
            elif report.failed:
                outcome = "FAIL"
            elif report.when == "call":
                outcome = "pass"
            else:
                return
            if outcomes.get(name) != "FAIL":
                outcomes[name] = outcome
            self.save()

        def pytest_collectreport(self, report: Any) -> None:
            if report.failed:  # the module did not import: every test fails
                outcomes.update(dict.fromkeys(names, "FAIL"))
                self.save()

        def save(self) -> None:
            partial = f"{path}.part"
            with open(partial, "w", encoding="utf-8") as f:
                json.dump(outcomes, f)
            os.replace(partial, path)

    args = [f"{test_file}::{CLASS}::{name}" for name in names]
    args += ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header", "-rN"]
    return int(pytest.main(args, plugins=[Recorder()]))


def _provide_test_imports() -> None:
    """What Horovod's test/utils/common.py imports besides horovod.torch, where it is
    missing: the ``mock`` backport (the standard library's ``unittest.mock``) and
    ``horovod.runner.util.threads.in_thread`` (a part of Horovod's launcher, absent from the
    built-in implementation, which the tests use only to start a thread)."""
    import importlib
    import sys
    import threading
    import types
    import unittest.mock

    try:
        importlib.import_module("mock")
    except ImportError:
        sys.modules["mock"] = unittest.mock
    try:
        importlib.import_module("horovod.runner.util.threads")
    except ImportError:

        def in_thread(
            target: Any, args: Any = (), name: Any = None, daemon: bool = True, silent: bool = False
        ) -> threading.Thread:
            thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
            thread.start()
            return thread

        threads = types.ModuleType("horovod.runner.util.threads")
        threads.in_thread = in_thread  # type: ignore[attr-defined]
        for name in ("horovod.runner", "horovod.runner.util"):
            sys.modules.setdefault(name, types.ModuleType(name))
        sys.modules["horovod.runner.util.threads"] = threads


def launch(impl: str, n: int, test_file: Path, names: list[str], timeout: float) -> dict[str, str]:
    """Run ``names`` in one launch of ``n`` ranks on ``impl``; each test's outcome."""
    from sparktrain import HorovodRunner
    from sparktrain.errors import RunTimeoutError, SparkTrainError

    with tempfile.TemporaryDirectory(prefix="hvd-suite-") as out_dir:
        runner = HorovodRunner(
            np=-n, horovod_impl=impl, timeout=timeout, driver_log_verbosity="log_callback_only"
        )
        ended = "done"
        try:
            runner.run(run_tests_on_rank, str(test_file), names, out_dir)
        except RunTimeoutError:
            ended = "HANG"
        except SparkTrainError:
            ended = "CRASH"
        per_rank = []
        for rank in range(n):
            path = Path(out_dir) / f"rank-{rank}.json"
            per_rank.append(json.loads(path.read_text()) if path.exists() else {})
    return combine(names, per_rank, ended)


def combine(names: list[str], per_rank: list[dict[str, str]], ended: str) -> dict[str, str]:
    """Each test's outcome from every rank's (``ended``: how the launch ended, ``"done"``,
    ``"HANG"`` or ``"CRASH"``; a test a rank has no outcome for takes it)."""
    results = {}
    for name in names:
        seen = [outcomes.get(name) for outcomes in per_rank]
        if "FAIL" in seen:
            results[name] = "FAIL"
        elif None in seen:
            results[name] = ended if ended != "done" else "CRASH"
        elif all(s == "skip" for s in seen):
            results[name] = "skip"
        elif all(s in ("pass", "skip") for s in seen):
            results[name] = "pass"
        else:
            results[name] = "FAIL"
    return results


def installed_horovod() -> bool:
    """Whether a real horovod.torch is built here."""
    from sparktrain.backends.horovod import horovod_torch_library

    return horovod_torch_library() is not None


def table(names: list[str], columns: dict[str, dict[str, str]]) -> str:
    """The per-test table and the totals, as text."""
    width = max(len(name) for name in names)
    heads = list(columns)
    lines = [f"{'test':<{width}}  " + "  ".join(f"{h:>13}" for h in heads)]
    for name in names:
        cells = [columns[h].get(name, "-") for h in heads]
        lines.append(f"{name:<{width}}  " + "  ".join(f"{c:>13}" for c in cells))
    lines.append("")
    for h in heads:
        counts = {o: sum(1 for v in columns[h].values() if v == o) for o in OUTCOMES}
        lines.append(f"{h}: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES))
    if len(heads) > 1:
        for a, b in zip(heads[::2], heads[1::2], strict=False):
            both = [n for n in names if columns[a].get(n) == "pass" == columns[b].get(n)]
            only = [n for n in names if columns[b].get(n) == "pass" != columns[a].get(n)]
            lines.append(f"{a} vs {b}: {len(both)} pass on both; {len(only)} pass only on {b}:")
            lines += [f"    {n} ({columns[a].get(n)})" for n in only]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run the suite, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod-src", type=Path, required=True, help="a Horovod checkout")
    parser.add_argument("--np", type=int, nargs="+", default=[2], help="rank counts (2 3)")
    parser.add_argument(
        "--impl",
        nargs="+",
        choices=("builtin", "horovod"),
        help="implementations (default: builtin, and horovod where it is installed)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per launch")
    parser.add_argument("--one-session", action="store_true", help="every test in one launch")
    parser.add_argument(
        "-k",
        dest="keywords",
        action="append",
        default=[],
        help="only tests whose name has this (repeat for several)",
    )
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    args = parser.parse_args(argv)
    test_file = (args.horovod_src / SUITE).resolve()
    if not test_file.is_file():
        parser.error(f"{test_file} does not exist: --horovod-src must be a Horovod checkout")
    keywords = args.keywords or [""]
    names = [n for n in test_names(test_file) if any(k in n for k in keywords)]
    if not names:
        parser.error(f"no test of {test_file.name} has any of {keywords} in its name")
    impls = args.impl or (["builtin", "horovod"] if installed_horovod() else ["builtin"])
    sys.path.insert(0, str(REPO))
    columns: dict[str, dict[str, str]] = {}
    for n in args.np:
        for impl in impls:
            column = columns.setdefault(f"{impl}/np{n}", {})
            started = time.monotonic()
            if args.one_session:
                column.update(launch(impl, n, test_file, names, args.timeout))
            else:
                for index, name in enumerate(names, 1):
                    column.update(launch(impl, n, test_file, [name], args.timeout))
                    print(f"[{impl} np={n} {index}/{len(names)}] {name}: {column[name]}",
                          file=sys.stderr, flush=True)  # fmt: skip
            print(f"{impl} np={n}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(table(names, columns))
    if args.json:
        args.json.write_text(json.dumps(columns, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
