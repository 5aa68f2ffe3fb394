"""The ``sparktrain`` command: ``run`` a script or function on N ranks, or check the machine.

Usage::

    sparktrain run --np 2 train.py -- --lr 0.1        # 2 ranks on Spark executors
    sparktrain run --np -2 mypkg.train:main -- --lr 0.1  # 2 ranks on this machine, no Spark
    sparktrain doctor [--spark]

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
import importlib
import inspect
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable, Sequence
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """A command line that cannot run; the message says what to change (exit code 2)."""


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
        type=int,
        required=True,
        help="ranks: N > 0 on Spark executors, -N on this machine without Spark",
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
    run.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    doctor = commands.add_parser(
        "doctor",
        help="check Python, Java, Spark, torch, Horovod, GPUs and say how to fix what is missing",
    )
    doctor.add_argument(
        "--spark",
        action="store_true",
        help="also start a local SparkSession and run a barrier stage (slow)",
    )
    return parser


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


# -- the rank function for scripts (runs inside each rank) --------------------------------


def run_script(path: str, source: str, argv: list[str]) -> None:
    """Run a script's source as ``__main__`` (``runpy.run_path``) with ``argv`` after its name.

    Where ``path`` holds the same source (np < 0, or a shared file system), it runs from
    there, with ``sys.argv = [path, *argv]``. Elsewhere it runs from a private copy with the
    same file name, so executors need not see the driver's files; ``sys.argv[0]`` and
    ``__file__`` then name that copy (``runpy`` sets them to the file it runs).
    """
    import linecache
    import runpy
    import shutil
    import tempfile

    target, tmp = path, None
    if not _has_source(path, source):
        tmp = tempfile.mkdtemp(prefix="sparktrain-script-")
        target = os.path.join(tmp, os.path.basename(path) or "script.py")
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(source)
        # The copy is gone by the time the traceback is rendered; keep its lines for it
        # (an entry without an mtime survives linecache.checkcache).
        linecache.cache[target] = (len(source), None, source.splitlines(True), target)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    try:
        runpy.run_path(target, run_name="__main__")
    except BaseException as exc:
        # Drop runpy's frames so the traceback goes from here straight into the script.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != target:
            tb = tb.tb_next
        exc.with_traceback(tb or exc.__traceback__)
        raise
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _has_source(path: str, source: str) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read() == source
    except (OSError, UnicodeDecodeError):
        return False


# -- resolving TARGET (on the driver) -----------------------------------------------------


def resolve_target(target: str, args: list[str]) -> tuple[Callable[..., Any], list[Any]]:
    """The function every rank runs and its positional arguments.

    Raises:
        UsageError: the script does not exist, the module or function cannot be found, or
            the function cannot take the given ARGS.
    """
    if target.endswith(".py") or os.path.isfile(target):
        if not os.path.isfile(target):
            raise UsageError(f"script {target!r} not found")
        try:
            with open(target, encoding="utf-8") as fh:
                source = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read script {target!r}: {exc}") from None
        return run_script, [os.path.abspath(target), source, list(args)]
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"TARGET {target!r} is neither a .py script nor module:function")
    fn = _import_function(module_name, attr)
    if _wants_argv(fn, args):
        try:
            inspect.signature(fn).bind(list(args))
        except TypeError:
            raise UsageError(
                f"{target} takes no arguments, but ARGS were given after `--`; "
                "give it a parameter for the list of arguments"
            ) from None
        except ValueError:  # no signature (a builtin): let the call decide
            pass
        return fn, [list(args)]
    return fn, []


def _import_function(module_name: str, attr: str) -> Callable[..., Any]:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` does
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise UsageError(
                f"module {module_name!r} not found (from {cwd}; is it installed or on PYTHONPATH?)"
            ) from None
        raise UsageError(f"importing {module_name!r} failed:\n{traceback.format_exc()}") from None
    except Exception:  # noqa: BLE001 - the user's module raised while importing
        raise UsageError(f"importing {module_name!r} failed:\n{traceback.format_exc()}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise UsageError(f"{module_name}:{attr} is not callable")
    _ship_by_value(module)
    fn: Callable[..., Any] = obj
    return fn


def _wants_argv(fn: Callable[..., Any], args: list[str]) -> bool:
    """ARGS were given, or the first parameter has no default (e.g. ``main(argv)``)."""
    if args:
        return True
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return (
        bool(parameters)
        and parameters[0].kind in positional
        and (parameters[0].default is inspect.Parameter.empty)
    )


def _ship_by_value(module: Any) -> None:
    """Pickle a module's functions by value unless executors can import it themselves."""
    path = getattr(module, "__file__", None)
    if not path:
        return
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    real = os.path.realpath(path)
    if any(real.startswith(os.path.realpath(p) + os.sep) for p in installed) or (
        module.__name__.split(".")[0] == "sparktrain"
    ):
        return
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)


# -- Spark --------------------------------------------------------------------------------


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
        master = (
            configured if configured and not configured.startswith("local") else (f"local[{np}]")
        )
    if master.startswith("local"):
        # Local executors start "python3" from PATH unless told otherwise.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


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
    from sparktrain.config import parse_duration
    from sparktrain.errors import CapacityError, ConfigurationError, SparkTrainError
    from sparktrain.runner import SparkRunner

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
    conf = _parse_conf(options.conf)
    if options.np < 0 and (options.master or conf):
        raise UsageError(
            "--master and --conf are for Spark runs (--np > 0); --np < 0 runs "
            "on this machine without Spark"
        )
    session = None
    try:
        runner = SparkRunner(options.np, **settings)
        fn, fn_args = resolve_target(options.target, args)
        if options.np > 0:
            name = os.path.basename(options.target)
            try:
                session = _spark_session(options.master, options.np, conf, f"sparktrain {name}")
            except UsageError:
                raise
            except Exception as exc:  # noqa: BLE001 - Java missing, bad master, …
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise UsageError(
                    f"could not start Spark (master {options.master or 'default'}): {first}; "
                    "`sparktrain doctor --spark` shows what is missing"
                ) from None
            runner = SparkRunner(options.np, spark=session, **settings)
        value = runner.run(fn, *fn_args)
    except (ConfigurationError, CapacityError) as exc:
        print(f"sparktrain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SparkTrainError as exc:
        print(f"sparktrain: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if session is not None:
            try:
                session.stop()
            except Exception:  # noqa: BLE001 - the outcome is already decided
                pass
    if value is not None:
        print(repr(value), flush=True)
    return EXIT_OK


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
            from sparktrain import doctor

            return doctor.main(spark=options.spark)
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
