"""``sparktrain kept list`` and ``sparktrain kept clean``: this user's kept results on this host.

A result that could not be returned is kept on the host where it was (see
:mod:`sparktrain.shipping.kept`); runs remove those older than ``kept_results_ttl`` by themselves, and
these commands show them and remove them at once.
"""

from __future__ import annotations

import argparse
import datetime
import time
from typing import Any

from sparktrain.commands.cli_target import UsageError
from sparktrain.units import parse_duration


def add_parser(commands: Any) -> None:
    """Add ``kept`` and its two commands to ``sparktrain``'s subcommands."""
    kept = commands.add_parser(
        "kept",
        help="list or remove the results sparktrain kept on this host",
        description="Results that could not be returned are kept on their host for "
        "kept_results_ttl (spark.sparktrain.keptResultsTtl, 3 days unless set); "
        "sparktrain.load_kept(path) reads one back.",
    )
    actions = kept.add_subparsers(dest="kept_command", metavar="ACTION", required=True)
    for name, text in (
        ("list", "list this user's kept results on this host, oldest first"),
        ("clean", "remove this user's kept results on this host"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument(
            "--tmpdir",
            default=None,
            help="the temporary folder the results were kept under (default: TMPDIR's)",
        )
        if name == "clean":
            action.add_argument(
                "--older-than",
                default=None,
                metavar="DURATION",
                help="only those written this long ago or earlier: seconds, or 30m, 12h, 3d "
                "(default: all)",
            )


def cmd_kept(options: argparse.Namespace, out: Any, err: Any) -> int:
    """Run ``sparktrain kept list`` or ``clean``; returns the exit code (1: something could
    not be removed)."""
    from sparktrain.shipping import kept

    if options.kept_command == "list":
        found = kept.listing(options.tmpdir)
        now = time.time()
        for item in found:
            when = datetime.datetime.fromtimestamp(item.written).isoformat(timespec="seconds")
            print(
                f"{item.path}\t{_size(item.size)}\t{when}\t{_age(now - item.written)} old",
                file=out,
            )
        print(f"{len(found)} kept result(s), {_size(sum(k.size for k in found))}", file=err)
        return 0
    older = None
    if options.older_than is not None:
        try:
            older = parse_duration(options.older_than)
        except ValueError as exc:
            raise UsageError(f"--older-than: {exc}") from exc
    removed, failed = kept.clean(older, options.tmpdir)
    for item in removed:
        print(f"removed {item.path}", file=out)
    for line in failed:
        print(f"could not remove {line}", file=err)
    print(
        f"removed {len(removed)} kept result(s), {_size(sum(k.size for k in removed))}",
        file=err,
    )
    return 1 if failed else 0


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 100 << 10 else f"{n} bytes"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{max(0.0, seconds):.0f}s"
