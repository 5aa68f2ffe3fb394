"""What the examples share: options, a local Spark, process-group helpers, a table printer.

Their data (MNIST / CIFAR-10, or stand-ins that need no download) is in :mod:`sparktrain.examples._data`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparktrain import private_dir

DEFAULT_MASTER = "local-cluster[2,1,1024]"

# Spark's own logging for an embedded session: errors only. The examples do not rely on the
# repository's conf/ folder, which an installed package does not have. A PySpark driver sets
# its root logger to the level of its gateway's logger, printing "Setting default log level
# to ..." when that differs from the root's: so both say error.
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


# --------------------------------------------------------------------------- options


def make_parser(
    name: str,
    description: str,
    *,
    np: int = 2,
    epochs: int = 3,
    batch_size: int = 64,
    lr: float | None = 0.01,
    lr_help: str = "",
    data: bool = True,
    checkpoints: bool = True,
) -> argparse.ArgumentParser:
    """An argument parser with the options every example shares.

    Args:
        name: the example's module name in ``sparktrain.examples``.
        description: the example's one-line description.
        np, epochs, batch_size, lr: the example's defaults (``lr=None``: the example
            picks one for the data, as ``lr_help`` says).
        lr_help: the help text's default part when ``lr`` is None.
        data: add ``--data-dir``.
        checkpoints: add ``--checkpoint-dir``.

    Returns:
        A parser with ``--np``, ``--local``, ``--master``, ``--epochs``, ``--batch-size``,
        ``--lr`` and, as asked, ``--data-dir`` and ``--checkpoint-dir``.
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m sparktrain.examples.{name}", description=description
    )
    parser.set_defaults(example=name)
    parser.add_argument(
        "--np",
        type=int,
        default=np,
        help=f"number of ranks; negative runs them on this machine without Spark (default {np})",
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help="run the ranks on this machine without Spark (the same as a negative --np)",
    )
    parser.add_argument(
        "--master",
        default=DEFAULT_MASTER,
        help="Spark master for the session this example starts when none is active "
        f"(default {DEFAULT_MASTER}: two executor JVMs on this machine); sc://HOST:PORT "
        "connects to a Spark Connect server instead",
    )
    parser.add_argument("--epochs", type=int, default=epochs, help=f"default {epochs}")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=batch_size,
        help=f"per-rank batch size (default {batch_size})",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=lr,
        help=f"learning rate (default {lr_help if lr is None else lr})",
    )
    if data:
        parser.add_argument(
            "--data-dir",
            default=None,
            help="torchvision data root holding MNIST / CIFAR-10 (never downloaded); "
            "without it the example uses data that needs no download",
        )
    if checkpoints:
        parser.add_argument(
            "--checkpoint-dir",
            default=None,
            help="where rank 0 saves checkpoints (local path or fsspec URL; default: a fresh "
            "directory under ./sparktrain-out/checkpoints)",
        )
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv`` and normalise ``--np`` / ``--local`` into one signed ``np``."""
    args = parser.parse_args(None if argv is None else list(argv))
    if args.np == 0:
        parser.error("--np must not be 0")
    if args.local:
        args.np = -abs(args.np)
    if getattr(args, "checkpoint_dir", "") is None:
        args.checkpoint_dir = fresh_dir(Path("sparktrain-out", "checkpoints"), args.example)
    return args


def fresh_dir(parent: str | os.PathLike[str], prefix: str) -> str:
    """A new directory's path under ``parent``, named after ``prefix``, the time and a nonce.

    Nothing is created: the checkpoint writer makes the directory at its first save, so a
    run that stops on a bad option leaves nothing behind.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.abspath(os.path.join(parent, f"{prefix}-{stamp}-{uuid.uuid4().hex[:6]}"))


def where(np: int) -> str:
    """Words for where ``np`` ranks run."""
    return f"{np} ranks on Spark executors" if np > 0 else f"{-np} ranks on this machine (no Spark)"


# --------------------------------------------------------------------------- extras

# What the examples import beyond sparktrain's own dependencies: the module, what it is called
# on PyPI, and the extra of sparktrain that installs it.
EXTRAS: Mapping[str, tuple[str, str]] = {
    "sklearn": ("scikit-learn", "examples"),
    "lightning": ("lightning", "frameworks"),
    "transformers": ("transformers", "frameworks"),
    "accelerate": ("accelerate", "frameworks"),
    "pyspark": ("pyspark", "spark"),
}


def require(args: argparse.Namespace, *modules: str) -> None:
    """Exit with the command that installs them when modules the example needs are missing.

    Checked on the driver before anything starts: the ranks import ``modules``, and they run
    this interpreter (``--np`` < 0, or the example's own local Spark); pyspark is needed too
    when the ranks run on Spark (``--np`` > 0). Without this, a missing module is found on
    every rank, after Spark has started.

    Args:
        args: the example's parsed options (``example`` and ``np``, see :func:`make_parser`).
        modules: top-level module names, each a key of :data:`EXTRAS`.

    Raises:
        SystemExit: some are missing; its message names them and the ``pip install``.
    """
    wanted = [*modules, *(["pyspark"] if args.np > 0 else [])]
    missing = [m for m in wanted if importlib.util.find_spec(m) is None]
    if not missing:
        return
    names = ", ".join(EXTRAS[m][0] for m in missing)
    extras = ",".join(sorted({EXTRAS[m][1] for m in missing}))
    raise SystemExit(
        f"sparktrain.examples.{args.example} needs {names}, not installed for "
        f"{sys.executable}: pip install 'sparktrain[{extras}]'"
    )


# --------------------------------------------------------------------------- Spark


def spark_session(master: str = DEFAULT_MASTER, app_name: str = "sparktrain-example") -> Any:
    """The active SparkSession, or a new quiet one on ``master`` (UI off, errors-only logs).

    Executors start ``PYSPARK_PYTHON``; it defaults here to this interpreter, so they share
    its packages (torch, sparktrain). Set it before calling to use another. A ``sc://``
    master is a Spark Connect server: the session is a Connect client of it (the server's
    own settings then say where the executors' Python is).

    Returns:
        ``(session, created)``: ``created`` is True when this call started the session, so
        the caller knows to stop it.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    if master.startswith("sc://"):
        return SparkSession.builder.remote(master).appName(app_name).getOrCreate(), True
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
    )
    log_conf = _log4j2_file()
    if log_conf is not None:
        option = f"-Dlog4j2.configurationFile=file:{log_conf}"
        builder = builder.config("spark.driver.extraJavaOptions", option).config(
            "spark.executor.extraJavaOptions", option
        )
    with warnings.catch_warnings():
        # pyspark's notice about pandas >= 3 says nothing about what these examples use.
        warnings.filterwarnings(
            "ignore", "PySpark does not yet fully support pandas", FutureWarning
        )
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session, True


def _log4j2_file() -> str | None:
    """A log4j2 configuration file with :data:`_LOG4J2` in the user's private folder, or None
    if none can be written (the JVM then logs as it would without it)."""
    try:
        folder = private_dir.root()
        path = folder / "log4j2.properties"
        if not path.is_file() or path.is_symlink() or path.read_text() != _LOG4J2:
            path = private_dir.write_new(folder, path.name, _LOG4J2.encode())
    except (OSError, private_dir.NotPrivateError):
        return None
    return str(path)


def master_of(session: Any) -> str:
    """The session's master: a Spark Connect client (no SparkContext) reads it from its conf."""
    from sparktrain.driver.places import is_connect

    if is_connect(session):
        return f"Spark Connect, {session.conf.get('spark.master', 'master not shown')}"
    return str(session.sparkContext.master)


@contextlib.contextmanager
def spark_for(np: int, master: str = DEFAULT_MASTER) -> Iterator[Any]:
    """Yield the SparkSession ``np`` ranks need: None for ``np < 0``; stop it after if started."""
    if np < 0:
        print(f"Ranks: {where(np)}", flush=True)
        yield None
        return
    start = time.monotonic()
    session, created = spark_session(master)
    actual = master_of(session)
    if created:
        print(f"Spark: started {actual} in {time.monotonic() - start:.1f} s", flush=True)
    else:
        print(f"Spark: using the active SparkSession ({actual})", flush=True)
    try:
        yield session
    finally:
        if created:
            session.stop()


# --------------------------------------------------------------------------- on the ranks


def init_distributed(backend: str | None = None) -> bool:
    """Join the run's process group when inside a run; return whether there is one.

    Outside a run (no ``MASTER_ADDR``) the function trains as a single process, so the
    same training function runs in a notebook cell, then through a runner.
    """
    import torch.distributed as dist

    import sparktrain

    if dist.is_available() and dist.is_initialized():
        return True
    if "MASTER_ADDR" not in os.environ:
        return False
    dist.init_process_group(backend or sparktrain.default_backend())
    return True


def shutdown_distributed() -> None:
    """Leave the process group: a barrier first, then ``destroy_process_group``.

    Without the barrier, a rank that destroys its Gloo group and exits while a peer is
    still destroying its own can make that peer abort ("terminate called without an active
    exception", SIGABRT); seen here with torch 2.13 after a few epochs of DDP.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def rank_device() -> Any:
    """The torch device for this rank: its CUDA device where it has one, else the CPU."""
    import torch

    import sparktrain

    if sparktrain.use_gpu():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# --------------------------------------------------------------------------- output


def format_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[tuple[str, str, str]],
    title: str | None = None,
) -> str:
    """Rows as an aligned text table.

    Args:
        rows: one mapping per row.
        columns: ``(key, header, format spec)`` per column, e.g. ``("loss", "loss", ".4f")``.
        title: an optional line above the table.
    """
    cells = [[h for _, h, _ in columns]]
    for row in rows:
        line = []
        for key, _, spec in columns:
            value = row.get(key)
            line.append("-" if value is None else format(value, spec))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    rule = "  ".join("-" * w for w in widths)
    text = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    out = ([title] if title else []) + [text[0], rule] + text[1:]
    return "\n".join(out)


def print_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[tuple[str, str, str]],
    title: str | None = None,
) -> str:
    """Print :func:`format_table` and return it."""
    text = format_table(rows, columns, title)
    print(text, flush=True)
    return text


EPOCH_COLUMNS: Sequence[tuple[str, str, str]] = (
    ("epoch", "epoch", "d"),
    ("loss", "train loss", ".4f"),
    ("accuracy", "test accuracy", ".2%"),
    ("seconds", "time/epoch (s)", ".2f"),
    ("ranks", "ranks", "d"),
)
