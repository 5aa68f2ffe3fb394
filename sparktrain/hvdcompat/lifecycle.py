"""``hvd.init()`` and ``hvd.shutdown()`` as the API gives them: the process group (see
:mod:`sparktrain.hvdcompat.basics`) with the process sets and the timeline around it."""

from __future__ import annotations

from typing import Any

from sparktrain.hvdcompat import basics, timeline
from sparktrain.hvdcompat.matching import forget_lanes
from sparktrain.hvdcompat.process_sets import forget_process_sets, init_process_sets


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job's process group (``horovod.torch.init``); a second call does nothing.

    Example:
        >>> hvd.init(process_sets=[hvd.ProcessSet([0, 1])])  # doctest: +SKIP

    Args:
        comm: a list of ranks, as in Horovod: here only every rank of the job, in order (an
            MPI communicator, or a subset of the ranks, is refused naming what to use).
        process_sets: ``hvd.ProcessSet`` objects to register now (every rank passes the same
            list, in the same order), or ``"dynamic"``/None to add them later with
            ``hvd.add_process_set``.

    Raises:
        NotImplementedError: for an MPI communicator.
        ValueError: when the environment does not say where this process belongs, for a
            ``comm`` list that is not every rank of the job, or for a
            process set that repeats another (then Horovod is initialized with the sets
            before it, as in Horovod).
    """
    first = not basics.is_initialized()
    basics.init(comm)
    if first:
        init_process_sets(process_sets)


def shutdown() -> None:
    """Leave the process group (``horovod.torch.shutdown``); init() may be called again.

    A timeline under way is written out, and every process set is forgotten (their objects
    lose their ids, as Horovod's do when removed).
    """
    timeline.stop()
    forget_lanes()
    forget_process_sets()
    basics.shutdown()
