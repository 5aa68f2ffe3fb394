"""The ``sparktrain`` command: ``run`` a script or function on N ranks, or check the machine.

Usage::

    sparktrain run --np 2 train.py -- --lr 0.1        # 2 ranks on Spark executors
    sparktrain run --np -2 mypkg.train:main -- --lr 0.1  # 2 ranks on this machine, no Spark
    sparktrain doctor [--spark] [--master URL [--checkpoint URL] [--conf KEY=VALUE]]
    sparktrain kept list | sparktrain kept clean [--older-than 3d]   # results kept here

TARGET is either a script or ``module:function``:

* ``path/to/script.py`` runs as ``__main__`` on every rank with
  ``sys.argv = [script, *ARGS]``. Its source travels with the run, so executors need not see
  the path; where they do see the same file (a shared file system, or np < 0), it runs from
  there, and its folder is on ``sys.path`` as with ``python script.py``.
* ``module:function`` (``module:obj.method`` too) is imported here, on the driver, with the
  current directory on ``sys.path`` as with ``python -m``. It is called as ``function(ARGS)``
  (ARGS as a list of strings) when ARGS are given or when its first parameter has no
  default; otherwise as ``function()``. A module that is not installed in site-packages is
  shipped by value, so executors need not have it.

Exit codes: 0 success (rank 0's return value is printed with ``repr`` unless None), 1 the run
failed (the error, root cause first, goes to stderr), 2 a usage or configuration error,
130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparktrain.commands import kept_cmd
from sparktrain.commands.cli_target import UsageError, resolve_target
from sparktrain.commands.pins import tested_constraints

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sparktrain`` (without the ``-- ARGS`` part)."""
    parser = argparse.ArgumentParser(
        prog="sparktrain",
        description="Distributed PyTorch training on Apache Spark, or on this machine alone.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="run a script or module:function on N ranks",
        description="Run TARGET on |NP| ranks: on Spark executors for NP > 0, on this "
        "machine for NP < 0. Arguments for TARGET go after `--`.",
        usage="sparktrain run --np N [options] TARGET [-- ARGS ...]",
    )
    run.add_argument(
        "--np",
        type=_np_arg,
        required=True,
        help="ranks: N > 0 on Spark executors, -N on this machine without Spark, MIN:MAX "
        "an elastic run on Spark executors (as many as the free task slots allow)",
    )
    run.add_argument(
        "--backend",
        choices=("torch", "horovod"),
        default=None,
        help="how ranks find each other (default: torch)",
    )
    run.add_argument(
        "--master",
        default=None,
        help="Spark master for NP > 0: local[N], local-cluster[N,C,MB], "
        "spark://HOST:PORT, yarn, k8s://… (default: the configured cluster, "
        "else local[NP])",
    )
    run.add_argument(
        "--timeout",
        default=None,
        help="limit for the whole run: seconds, or 30s, 5m, 1h (default: none)",
    )
    run.add_argument(
        "--start-timeout", default=None, help="limit for every rank to start (default: 120s)"
    )
    run.add_argument(
        "--log",
        choices=("all", "log_callback_only"),
        default=None,
        dest="verbosity",
        help="driver output: every rank's output (all, the default) or only "
        "sparktrain.log_to_driver messages",
    )
    run.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark setting for the session this command creates (repeatable)",
    )
    run.add_argument("target", metavar="TARGET", help="path/to/script.py or module:function")
    run.add_argument("extra", nargs="*", default=[], help=argparse.SUPPRESS)
    doctor = commands.add_parser(
        "doctor",
        help="check Python, Java, Spark, torch, Horovod, GPUs and say how to fix what is missing",
    )
    doctor.add_argument(
        "--spark",
        action="store_true",
        help="also start a local SparkSession and run a barrier stage (slow)",
    )
    doctor.add_argument(
        "--master",
        default=None,
        help="a cluster to check host by host (spark://HOST:PORT, yarn, k8s://…): one task "
        "per executor reports versions, GPUs and network interfaces",
    )
    doctor.add_argument(
        "--checkpoint",
        default=None,
        metavar="URL",
        help="with --master: check that this checkpoint URL is writable and shared by every host",
    )
    doctor.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark setting for the session --master creates (repeatable)",
    )
    commands.add_parser(
        "constraints",
        help="print the versions sparktrain was tested with, as a pip constraints file",
        description="Print the pins the tests of this release ran with (torch the CPU build's "
        "version), for pip install -c FILE: sparktrain constraints > constraints.txt",
    )
    install = commands.add_parser(
        "install-horovod",
        help="build Horovod 0.28.1 for today's torch (C++17, Gloo, MPI where installed)",
        description="Build and install Horovod with PyTorch support into a Python "
        "environment (a C++ compiler and cmake are needed; ~4-12 min; pip caches the wheel).",
    )
    install.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter whose environment gets Horovod (default: this one)",
    )
    kept_cmd.add_parser(commands)
    return parser


def install_horovod_script() -> Path:
    """The packaged build recipe that ``sparktrain install-horovod`` runs."""
    return Path(__file__).with_name("install-horovod.sh")


def cmd_install_horovod(options: argparse.Namespace) -> int:
    """``sparktrain install-horovod``: runs the packaged recipe; returns its exit code."""
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        raise UsageError("install-horovod needs bash, which is not on PATH")
    env = {k: v for k, v in os.environ.items() if k != "SPARKTRAIN_REPO"}
    return subprocess.call([bash, str(install_horovod_script()), options.python], env=env)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``argv`` at the first ``--`` and parse the part before it.

    Returns:
        The parsed options and the ARGS for TARGET.

    Raises:
        SystemExit: code 2, with argparse's usage message, for a malformed command line.
    """
    argv = list(argv)
    head, rest = argv, []
    if "--" in argv:
        cut = argv.index("--")
        head, rest = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    options = parser.parse_args(head)
    if options.command == "run" and options.extra:
        raise UsageError(
            f"unexpected arguments {' '.join(options.extra)!r}: arguments for "
            f"{options.target} go after `--` (sparktrain run --np N "
            f"{options.target} -- ARGS)"
        )
    return options, rest


# -- Spark --------------------------------------------------------------------------------


def _np_arg(text: str) -> int | tuple[int, int]:
    """``--np``: N, -N, or MIN:MAX (torchrun's ``--nnodes`` spelling: a comma would read as
    a list, and a dash as a negative number)."""
    low, sep, high = text.partition(":")
    try:
        if not sep:
            return int(text)
        return int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not N (ranks on Spark executors), -N (on this machine) or MIN:MAX "
            "(an elastic run on Spark executors, e.g. 2:4)"
        ) from None


def _most(np: int | tuple[int, int]) -> int:
    """The most ranks ``np`` asks for (negative: on this machine)."""
    return np if isinstance(np, int) else max(np)


def _spark_session(master: str | None, np: int, conf: dict[str, str], app: str) -> Any:
    """Build the session for ``np > 0``: ``master``, else the configured one, else local[np]."""
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError:
        raise UsageError(
            f"--np {np} runs on Spark, but pyspark is not installed (pip install "
            f"'sparktrain[spark]'), or use --np {-np} to run on this machine"
        ) from None
    if master is None:
        # Whatever spark-submit would use (spark-defaults.conf, MASTER, --master); Spark's
        # own fallback is local[*], which may have fewer slots than np.
        configured = _configured_master(SparkContext)
        master = configured if configured and not configured.startswith("local") else f"local[{np}]"
    if master.startswith("local"):
        # Local executors start "python3" from PATH unless told otherwise.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _start_spark(options: argparse.Namespace, conf: dict[str, str]) -> Any:
    """:func:`_spark_session` for the options; a Spark that cannot start is a usage error."""
    name = os.path.basename(options.target)
    try:
        return _spark_session(options.master, _most(options.np), conf, f"sparktrain {name}")
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - Java missing, bad master, …
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(
            f"could not start Spark (master {options.master or 'default'}): {first}; "
            "`sparktrain doctor --spark` shows what is missing"
        ) from None


def _configured_master(context: Any) -> str | None:
    try:
        getter = getattr(context, "getSystemProperty", None)
        if getter is not None:
            value = getter("spark.master")
            return str(value) if value else None
        from pyspark import SparkConf

        context._ensure_initialized()  # pyspark < 4: start the JVM, which reads the defaults
        return SparkConf().get("spark.master", None)
    except Exception:  # noqa: BLE001 - fall back to local
        return None


def _parse_conf(items: list[str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--conf {item!r}: use --conf KEY=VALUE")
        conf[key.strip()] = value
    return conf


# -- commands -----------------------------------------------------------------------------


def cmd_run(options: argparse.Namespace, args: list[str]) -> int:
    """``sparktrain run``: returns the exit code."""
    from sparktrain.errors import CapacityError, ConfigurationError, SparkTrainError
    from sparktrain.runner import SparkRunner

    settings = _runner_settings(options)
    conf = _parse_conf(options.conf)
    if _most(options.np) < 0 and (options.master or conf):
        raise UsageError(
            "--master and --conf are for Spark runs (--np > 0); --np < 0 runs "
            "on this machine without Spark"
        )
    session = None
    try:
        # The settings are checked before TARGET is imported and Spark starts (both slow).
        runner = SparkRunner(options.np, **settings)
        fn, fn_args = resolve_target(options.target, args)
        if _most(options.np) > 0:
            session = _start_spark(options, conf)
            runner = SparkRunner(options.np, spark=session, **settings)
        value = runner.run(fn, *fn_args)
    except SparkTrainError as exc:
        print(f"sparktrain: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, (ConfigurationError, CapacityError)) else EXIT_FAILED
    finally:
        if session is not None:
            with contextlib.suppress(Exception):  # the outcome is already decided
                session.stop()
    if value is not None:
        print(repr(value), flush=True)
    return EXIT_OK


def cmd_doctor(options: argparse.Namespace) -> int:
    """``sparktrain doctor``: returns the exit code."""
    from sparktrain.commands import doctor

    conf = _parse_conf(options.conf)
    if (options.checkpoint or conf) and not options.master:
        raise UsageError("--checkpoint and --conf need --master: the cluster to check them on")
    if options.master is None:
        return doctor.main(spark=options.spark)
    try:
        session = _spark_session(options.master, 1, conf, "sparktrain doctor")
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - Java missing, bad master, …
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"could not start Spark (master {options.master}): {first}") from None
    try:
        return doctor.main(spark=options.spark, session=session, checkpoint=options.checkpoint)
    finally:
        with contextlib.suppress(Exception):
            session.stop()


def _runner_settings(options: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~sparktrain.runner.SparkRunner` settings that the options give."""
    from sparktrain.units import parse_duration

    settings: dict[str, Any] = {}
    for name in ("timeout", "start_timeout"):
        text = getattr(options, name)
        if text is not None:
            try:
                settings[name] = parse_duration(text)
            except ValueError as exc:
                raise UsageError(f"--{name.replace('_', '-')}: {exc}") from None
    if options.backend:
        settings["backend"] = options.backend
    if options.verbosity:
        settings["driver_log_verbosity"] = options.verbosity
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sparktrain`` command; returns the exit code.

    Example:
        >>> main(["run", "--np", "-2", "train.py", "--", "--epochs", "1"])
        0
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        options, args = parse(argv)
        if options.command == "doctor":
            if args:
                raise UsageError("sparktrain doctor takes no ARGS")
            return cmd_doctor(options)
        if options.command == "constraints":
            if args:
                raise UsageError("sparktrain constraints takes no ARGS")
            sys.stdout.write(tested_constraints())
            return 0
        if options.command == "install-horovod":
            if args:
                raise UsageError("sparktrain install-horovod takes no ARGS")
            return cmd_install_horovod(options)
        if options.command == "kept":
            if args:
                raise UsageError("sparktrain kept takes no ARGS")
            return kept_cmd.cmd_kept(options, sys.stdout, sys.stderr)
        return cmd_run(options, args)
    except UsageError as exc:
        print(f"sparktrain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        print("sparktrain: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
