"""``horovod.torch.elastic`` on sparktrain's restarts and elastic sizes.

Horovod's elastic scripts run unchanged: ``@hvd.elastic.run`` around ``train(state)``,
``hvd.elastic.TorchState`` / ``ObjectState`` / ``State``, ``hvd.elastic.ElasticSampler``. What
differs from Horovod: a failure relaunches every rank (``max_restarts``), so a commit outlives
the processes only when the ranks' environment names a folder for it
(``SPARKTRAIN_HVD_COMMIT_DIR``); and ``HostsUpdatedInterrupt`` means that sparktrain asked the
ranks to stop (``sparktrain.should_stop()``), which ends the attempt after the commit.
"""

from __future__ import annotations

from sparktrain.hvdcompat.elastic.commits import COMMIT_DIR_ENV
from sparktrain.hvdcompat.elastic.run import run
from sparktrain.hvdcompat.elastic.sampler import ElasticSampler
from sparktrain.hvdcompat.elastic.state import ObjectState, State, TorchState
from sparktrain.hvdcompat.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = [
    "COMMIT_DIR_ENV",
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "run",
]
