"""MLflow tracking on the driver: rank 0's reported metrics, and the final checkpoint.

Used only when MLflow is installed (``mlflow`` or ``mlflow-skinny``) and the driver has an
active run (``mlflow.start_run()``): the metrics land in the user's own run, not a new one.
Tracking is best-effort: the first error becomes one warning and tracking stops for the run;
training never fails because of it.

Example:
    >>> with mlflow.start_run():
    ...     SparkRunner(np=2).run(train)     # report(epoch=…, loss=…) → mlflow metrics
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from typing import Any

from sparktrain import private_dir
from sparktrain.checkpoint.layout import newest_committed

ARTIFACT_PATH = "checkpoint"
CHECKPOINT_TAG = "sparktrain.checkpoint"
# MLflow's log_batch takes at most 1000 metrics per call.
MAX_BATCH = 1000


class MlflowTracker:
    """Logs rank 0's reports to an MLflow run, and a checkpoint as an artifact at the end.

    Metrics are buffered and sent with ``log_batch`` once ``flush_every`` are waiting or
    ``flush_interval`` seconds have passed since the last send, so a remote tracking server
    does not slow the driver down per report; :meth:`finish` sends the rest.

    Each metric is logged with the report's ``step``; a report without a step uses the
    number of rank 0's reports before it. ``epoch``, when given, is logged as a metric too.

    Args:
        client: an ``mlflow.tracking.MlflowClient`` (or anything with its ``log_batch``,
            ``log_artifact``, ``log_artifacts`` and ``set_tag``).
        run_id: the run to log into.
        flush_every: metrics to collect before sending them.
        flush_interval: seconds after which waiting metrics are sent with the next report.
    """

    def __init__(
        self, client: Any, run_id: str, *, flush_every: int = 100, flush_interval: float = 5.0
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.flush_every = max(1, min(flush_every, MAX_BATCH))
        self.flush_interval = flush_interval
        self._pending: list[Any] = []
        self._reports = 0
        self._last_flush = time.monotonic()
        self._failed = False
        self._finished = False

    @classmethod
    def maybe_create(cls) -> MlflowTracker | None:
        """A tracker for the driver's active MLflow run; None without MLflow or without a run.

        A run can only be active if this process has imported mlflow already, so nothing is
        imported here (``import mlflow`` takes seconds).
        """
        mlflow = sys.modules.get("mlflow")
        if mlflow is None:
            return None
        try:
            run = mlflow.active_run()
            if run is None:
                return None
            from mlflow.tracking import MlflowClient

            return cls(MlflowClient(), run.info.run_id)
        except Exception as exc:  # noqa: BLE001 - tracking must never stop a run
            _warn(exc)
            return None

    def on_report(self, message: Mapping[str, Any]) -> None:
        """Queue rank 0's metrics of one ``report`` message (other ranks are ignored)."""
        if self._failed or self._finished or message.get("rank") != 0:
            return
        try:
            from mlflow.entities import Metric

            step = message.get("step")
            if not isinstance(step, int) or isinstance(step, bool):
                step = self._reports
            self._reports += 1
            stamp = int(time.time() * 1000)
            values: dict[str, Any] = dict(message.get("metrics") or {})
            epoch = message.get("epoch")
            if isinstance(epoch, (int, float)) and not isinstance(epoch, bool):
                values.setdefault("epoch", epoch)
            for name, value in values.items():
                self._pending.append(Metric(str(name), float(value), stamp, step))
            if len(self._pending) >= self.flush_every or (
                time.monotonic() - self._last_flush >= self.flush_interval
            ):
                self._flush()
        except Exception as exc:  # noqa: BLE001 - tracking must never stop a run
            self._fail(exc)

    def finish(self, checkpoint_dir: str | None = None) -> None:
        """Send waiting metrics; log ``checkpoint_dir``'s final checkpoint, if one is given.

        ``checkpoint_dir`` may be a directory written by :func:`sparktrain.checkpoint.save`
        (only its newest committed checkpoint, data and commit marker, is logged), any other
        local directory (logged whole), a single file, or an fsspec URL of a
        ``sparktrain.checkpoint`` directory (its newest checkpoint is downloaded, then
        logged). Artifacts go under ``checkpoint/``; the tag ``sparktrain.checkpoint`` names
        the source. Later calls do nothing.
        """
        if self._finished:
            return
        self._finished = True
        if self._failed:
            return
        try:
            self._flush()
            if checkpoint_dir:
                self._log_checkpoint(os.fspath(checkpoint_dir))
        except Exception as exc:  # noqa: BLE001 - tracking must never stop a run
            self._fail(exc)

    # -- internals ------------------------------------------------------------------------

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            self.client.log_batch(self.run_id, metrics=batch)

    def _fail(self, exc: BaseException) -> None:
        self._failed = True
        self._pending = []
        _warn(exc)

    def _log_checkpoint(self, where: str) -> None:
        if "://" in where and not where.startswith("file://"):
            self._log_remote(where)
            return
        path = where[len("file://") :] if where.startswith("file://") else where
        if os.path.isfile(path):
            self.client.log_artifact(self.run_id, path, ARTIFACT_PATH)
            source = path
        elif os.path.isdir(path):
            newest = newest_committed(os.listdir(path), lambda name: _read_local(path, name))
            if newest is None:
                self.client.log_artifacts(self.run_id, path, ARTIFACT_PATH)
                source = path
            else:
                for name in newest:
                    self._log_entry(os.path.join(path, name))
                source = os.path.join(path, newest[1])
        else:
            raise FileNotFoundError(f"the checkpoint path {where!r} does not exist")
        self.client.set_tag(self.run_id, CHECKPOINT_TAG, source)

    def _log_entry(self, path: str) -> None:
        """A checkpoint's file, or its folder (a sharded checkpoint's) under its own name."""
        if os.path.isdir(path):
            name = os.path.basename(path.rstrip("/"))
            self.client.log_artifacts(self.run_id, path, f"{ARTIFACT_PATH}/{name}")
        else:
            self.client.log_artifact(self.run_id, path, ARTIFACT_PATH)

    def _log_remote(self, url: str) -> None:
        import fsspec

        fs, root = fsspec.core.url_to_fs(url)
        root = root.rstrip("/")
        if fs.isfile(root):
            names, root = [root.rsplit("/", 1)[-1]], root.rsplit("/", 1)[0]
            source = url
        else:
            listed = [str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)]
            found = newest_committed(listed, lambda name: fs.cat_file(f"{root}/{name}"))
            if found is None:
                raise FileNotFoundError(
                    f"no committed sparktrain checkpoint (step-*.commit.json) in {url!r}"
                )
            names = list(found)
            source = f"{url.rstrip('/')}/{found[1]}"
        tmp = tempfile.mkdtemp(prefix="ckpt-", dir=private_dir.usable_root())
        try:
            for name in names:
                if fs.isdir(f"{root}/{name}"):  # a sharded checkpoint: a folder of shards
                    fs.get(f"{root}/{name}/", os.path.join(tmp, name) + "/", recursive=True)
                else:
                    fs.get_file(f"{root}/{name}", os.path.join(tmp, name))
            for name in names:
                self._log_entry(os.path.join(tmp, name))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.client.set_tag(self.run_id, CHECKPOINT_TAG, source)


def _read_local(directory: str, name: str) -> bytes:
    with open(os.path.join(directory, name), "rb") as fh:
        return fh.read()


def _warn(exc: BaseException) -> None:
    warnings.warn(
        f"sparktrain: MLflow tracking failed and is off for the rest of this run "
        f"({type(exc).__name__}: {exc}); training goes on",
        RuntimeWarning,
        stacklevel=3,
    )
