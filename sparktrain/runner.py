"""SparkRunner: validate, pickle, launch on Spark barrier tasks or the driver, return rank 0's value."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from sparktrain.backends import check_backend_name
from sparktrain.config import RunConfig
from sparktrain.driver.channel import ChannelServer
from sparktrain.driver.connect_check import ConnectPlan
from sparktrain.driver.controller import Call, Display, execute, pickled_hook, prepare
from sparktrain.driver.handle import RunHandle
from sparktrain.driver.inflight import expect, forget
from sparktrain.driver.places import place_for
from sparktrain.driver.run_record import AttemptRecord, RunRecord
from sparktrain.errors import ConfigurationError, PayloadError
from sparktrain.shipping.script import run_script, script_call
from sparktrain.shipping.signature import check_call


class SparkRunner:
    """Runs a training function on ``np`` ranks and returns rank 0's return value.

    ``np > 0`` runs one rank per Spark barrier task on the executors of the active (or given)
    SparkSession; with ``spark.task.resource.gpu.amount=k`` each task holds k GPUs and runs
    k ranks, one per GPU (np must then be a multiple of k). ``np < 0`` runs ``-np`` ranks as subprocesses of the driver, without Spark.
    Every rank gets the ``env://`` variables (``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE``, …), so
    ``torch.distributed.init_process_group(sparktrain.default_backend())`` needs no arguments.

    ``np=(min, max)`` makes the run elastic: it starts with as many ranks in that range as
    the cluster's free task slots allow, goes on smaller after a lost rank (``max_restarts``),
    and grows back at a checkpoint when slots free up (``resize_interval``,
    ``elastic_grow``); ``last_run.sizes`` lists each attempt's size.

    Args:
        np: number of ranks; negative runs them on the driver. Zero is an error. A tuple
            ``(min, max)`` of positive ints runs an elastic run on Spark executors.
        backend: ``"torch"`` (torch.distributed) or ``"horovod"``.
        driver_log_verbosity: ``"all"`` streams every rank's output to the driver;
            ``"log_callback_only"`` shows only ``sparktrain.log_to_driver`` messages (and
            failed ranks' output, in the error).
        start_timeout: seconds for every rank to reach the rendezvous (a number, or text as
            Spark settings write durations: ``"90s"``, ``"10m"``, ``"1h"``).
        timeout: seconds (or a duration as text) for the whole run; ``None`` for no limit.
        env: extra environment variables for every rank.
        use_gpu: ``None`` uses GPUs where the ranks have them; ``False`` hides them.
        spark: the SparkSession for ``np > 0`` (default: the active one).
        progress: show a progress bar on the driver once ranks call ``sparktrain.report``.
        total_epochs: the number of epochs, so the progress bar can show how far along it is.
        checkpoint_dir: where the function saves checkpoints; when MLflow is tracking a run
            on the driver, the newest checkpoint is logged to it at the end.
        **settings: any other :class:`~sparktrain.config.RunConfig` field (``grace_period``,
            ``max_result_bytes``, ``max_restarts``, ``launcher``, …).

    Raises:
        ConfigurationError: at construction, for an invalid setting.

    Example:
        >>> def train(lr):
        ...     import torch.distributed as dist, sparktrain
        ...     dist.init_process_group(sparktrain.default_backend())
        ...     return {"rank": dist.get_rank(), "lr": lr}
        >>> SparkRunner(np=-2).run(train, lr=0.01)
        {'rank': 0, 'lr': 0.01}
    """

    def __init__(
        self,
        np: int | tuple[int, int],
        *,
        backend: str | None = None,
        driver_log_verbosity: str | None = None,
        start_timeout: float | str | None = None,
        timeout: float | str | None = None,
        env: Mapping[str, str] | None = None,
        use_gpu: bool | None = None,
        spark: Any = None,
        progress: bool = True,
        total_epochs: int | None = None,
        checkpoint_dir: str | None = None,
        **settings: Any,
    ) -> None:
        self._overrides: dict[str, Any] = {
            "backend": backend,
            "driver_log_verbosity": driver_log_verbosity,
            "start_timeout": start_timeout,
            "timeout": timeout,
            "env": env,
            "use_gpu": use_gpu,
            **settings,
        }
        self.np = np
        self._spark = spark
        # Validate now (without the session's conf) so mistakes surface at construction.
        self.config = RunConfig.resolve(np, self._overrides)
        check_backend_name(self.config.backend)
        self.last_run: RunRecord | None = None
        self._show_progress = progress
        self._total_epochs = total_epochs
        self._checkpoint_dir = checkpoint_dir
        self._pre_rendezvous_hook: Callable[[int], None] | None = None
        # Private test hook: called on the driver with each attempt's channel once it listens.
        self._channel_hook: Callable[[ChannelServer], None] | None = None
        # What the probe found of each Spark Connect session this runner has run on, by id.
        self._connect_plans: dict[str, ConnectPlan] = {}

    def _session(self, handle: RunHandle | None) -> Any:
        if self._spark is not None:
            return self._spark
        if handle is not None and handle.spark is not None:
            # The session active where the run was submitted: PySpark's is per thread.
            return handle.spark
        try:
            from pyspark.sql import SparkSession
        except ImportError as exc:
            raise ConfigurationError(
                f"np={self.np} runs on Spark executors, but pyspark is not installed "
                "(pip install 'sparktrain[spark]'), or use a negative np to run on the driver"
            ) from exc
        active = SparkSession.getActiveSession()
        if active is None:
            raise ConfigurationError(
                f"np={self.np} runs on Spark executors, but there is no active SparkSession: "
                "create one (SparkSession.builder.getOrCreate()), pass spark=..., or use a "
                "negative np to run on the driver"
            )
        return active

    def run(
        self, fn: Callable[..., Any] | str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` on every rank; return rank 0's return value.

        ``fn`` may also be the path of a Python script, as with TorchDistributor:
        ``run("train.py", "--lr", "0.01")`` runs it as ``__main__`` on every rank with
        ``sys.argv = ["train.py", "--lr", "0.01"]`` (string arguments only, no keywords), and
        returns None; a script that raises or exits non-zero fails the run. Its source travels
        with the run, so executors need not see the driver's file.

        Raises:
            PayloadError: ``fn`` or its arguments cannot be pickled (the captured object is
                named), or rank 0's result cannot be pickled or is too large; a script
                path that is not a file, or a script argument that is not a str.
            CapacityError: the cluster cannot run ``np`` tasks at once.
            WorkerFailedError: a rank failed; the root cause comes first.
            RendezvousTimeoutError: ranks never reached the rendezvous in time.
            RunTimeoutError: the run exceeded ``timeout``.

        With ``max_restarts=K``, a run that fails for a reason other than an exception raised
        by the function (a rank killed, an executor lost, a rendezvous timeout) is launched
        again, up to K times; each attempt and its cause is logged, and recorded in
        :attr:`last_run` (with the time each phase took). The function resumes from its own checkpoints
        (``sparktrain.checkpoint.load_latest``); ``sparktrain.attempt()`` tells which attempt
        it is in. ``restart_on_user_error=True`` restarts after exceptions too.
        """
        return self._call(fn, args, kwargs, all_ranks=False)

    def run_all(
        self, fn: Callable[..., Any] | str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return every rank's value, by rank.

        The same as :meth:`run` (checks, restarts, script paths, errors), but the result is
        a list of ``world_size`` values, item ``i`` being what rank ``i`` returned (None for a
        rank that returned nothing, and for every rank of a script). ``max_result_bytes``
        limits the ranks' pickled values together: what does not fit is kept on its rank's
        host (and what did reach the driver, on the driver), and the error names every file
        (``sparktrain.load_kept`` reads one back).

        Example:
            >>> def where():
            ...     import os, sparktrain
            ...     return sparktrain.rank(), os.getpid()
            >>> SparkRunner(np=-2).run_all(where)
            [(0, 41211), (1, 41212)]

        Raises:
            PayloadError: as :meth:`run`, for any rank's result (the rank is named), or the
                ranks' results together are larger than ``max_result_bytes``.
            ConfigurationError: ``launcher="mpi"``, which returns rank 0's value alone.
            CapacityError, WorkerFailedError, RendezvousTimeoutError, RunTimeoutError: as
                :meth:`run`.
        """
        values: list[Any] = self._call(fn, args, kwargs, all_ranks=True)
        return values

    def _call(
        self,
        fn: Callable[..., Any] | str | os.PathLike[str],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        all_ranks: bool,
        handle: RunHandle | None = None,
    ) -> Any:
        """One run, blocking until it ends: rank 0's value, or every rank's (``all_ranks``).

        Everything about the call lives here (nothing on ``self`` but :attr:`last_run`), so
        several calls may run at once from threads of one runner.
        """
        call = _call_of(fn, args, kwargs, all_ranks)
        place = place_for(None if self.config.local else self._session(handle), self._connect_plans)
        # The place's conf is read once for the call (from Connect, each read is a round trip).
        conf = place.conf()
        found = place.spark_settings(conf)
        config = self.config
        if found is not None:
            config = RunConfig.resolve(self.np, self._overrides, spark_conf=found)
        run = prepare(place, config, conf, call, pickled_hook(self._pre_rendezvous_hook))
        record = self.last_run = RunRecord()
        display = Display(
            self._show_progress,
            self._total_epochs,
            self._checkpoint_dir,
            on_channel=self._channel_hook,
        )
        return execute(run, record, display, handle)

    def submit(
        self, fn: Callable[..., Any] | str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> RunHandle:
        """Start ``run(fn, *args, **kwargs)`` and return at once, with its handle.

        The run goes on in a thread of the driver; the notebook stays usable. Its ranks' lines
        are kept in the handle (``handle.logs()``, ``handle.tail()``), and printed only where
        ``handle.follow()`` is called. Runs of one process share the cluster: a run that
        does not fit beside the others still going waits its turn, in the order runs were
        submitted (``handle.status()`` says for what, and its place in line); with
        ``queue_wait=0`` it gets a ``CapacityError`` at once instead.

        Returns:
            A :class:`~sparktrain.driver.handle.RunHandle`, a ``concurrent.futures.Future``:
            ``handle.result()`` is rank 0's value, or raises what ``run()`` would;
            ``handle.cancel()`` stops every rank; ``handle.last_run`` is its record.

        Example:
            >>> handle = SparkRunner(np=2).submit(train, lr=0.01)
            >>> handle.follow()           # live output in this cell; Ctrl-C stops following
            >>> metrics = handle.result()
        """
        if callable(fn):
            check_call(fn, args, kwargs)  # a call that cannot bind fails here, not later
        return self._submit(fn, args, kwargs, all_ranks=False)

    def submit_all(
        self, fn: Callable[..., Any] | str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> RunHandle:
        """Start ``run_all(fn, *args, **kwargs)`` and return at once, with its handle.

        As :meth:`submit`, but ``handle.result()`` is every rank's value, a list by rank.
        """
        if callable(fn):
            check_call(fn, args, kwargs)
        return self._submit(fn, args, kwargs, all_ranks=True)

    def _submit(
        self,
        fn: Callable[..., Any] | str | os.PathLike[str],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        all_ranks: bool,
    ) -> RunHandle:
        name = getattr(fn, "__name__", str(fn))
        handle = RunHandle(name)
        if not self.config.local:
            handle.spark = self._session(None)  # no session: say so now, in the caller's cell

        def call() -> Any:
            return self._call(fn, args, kwargs, all_ranks, handle)

        # A daemon: the interpreter's exit must not wait hours for a run (the handle stops
        # the runs still going at exit instead).
        thread = threading.Thread(
            target=handle._carry_out, args=(call,), name=f"sparktrain-run-{name}", daemon=True
        )
        expect(handle.ticket)  # runs submitted after it wait until it takes its place
        try:
            thread.start()
        except BaseException:
            forget(handle.ticket)
            raise
        return handle

    @property
    def history(self) -> list[dict[str, Any]]:
        """The last run's reports (``last_run.reports``): every rank's, as received."""
        return self.last_run.reports if self.last_run is not None else []

    @property
    def attempts(self) -> list[AttemptRecord]:
        """The last run's attempts (``last_run.attempts``), each with its cause and phases."""
        return self.last_run.attempts if self.last_run is not None else []


def _call_of(
    fn: Callable[..., Any] | str | os.PathLike[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    all_ranks: bool,
) -> Call:
    """What a call of run() runs, its arguments checked: a function, or a script's path."""
    if not isinstance(fn, (str, os.PathLike)):
        check_call(fn, args, kwargs)
        return Call(getattr(fn, "__name__", "function"), fn, args, kwargs, all_ranks)
    if kwargs:
        raise PayloadError(
            f"a script takes command-line arguments only, but keyword arguments "
            f"{sorted(kwargs)} were given: pass them as strings, e.g. "
            f"run({os.fspath(fn)!r}, '--{next(iter(kwargs))}', '...')"
        )
    script = tuple(script_call(fn, args))
    return Call(os.path.basename(os.fspath(fn)), run_script, script, {}, all_ranks, script)


class HorovodRunner(SparkRunner):
    """Databricks' HorovodRunner API on any Spark: ``SparkRunner`` with the Horovod backend.

    Code written for ``sparkdl.HorovodRunner`` runs by changing its import. Where Horovod is
    not installed, the ranks' ``import horovod.torch`` gives sparktrain's built-in one, on
    torch.distributed (``horovod_impl="builtin"`` picks it even where Horovod is installed),
    and the driver's gives a stand-in that names the same API (so a notebook's module-level
    ``import horovod.torch as hvd`` works; its functions run on the ranks).

    Args:
        np: number of ranks; negative runs them on the driver; ``(min, max)``: elastic.
        driver_log_verbosity: ``"all"`` (the default, as Databricks' HorovodRunner has it
            now: every rank's lines stream to the driver, prefixed ``[rank N]``) or
            ``"log_callback_only"`` (only ``log_to_driver`` messages). ``None`` takes
            ``spark.sparktrain.driverLogVerbosity`` / ``SPARKTRAIN_DRIVER_LOG_VERBOSITY``
            where set, as every other setting.
        **settings: any other SparkRunner setting (``launcher="mpi"``, ``horovod_impl``,
            ``timeout``, …).

    Example:
        >>> def train_hvd(learning_rate):
        ...     import horovod.torch as hvd
        ...     hvd.init()
        ...     ...
        >>> HorovodRunner(np=2).run(train_hvd, learning_rate=0.001)
    """

    def __init__(
        self,
        *,
        np: int | tuple[int, int],
        driver_log_verbosity: str | None = None,
        **settings: Any,
    ) -> None:
        settings.setdefault("backend", "horovod")
        super().__init__(np, driver_log_verbosity=driver_log_verbosity, **settings)
