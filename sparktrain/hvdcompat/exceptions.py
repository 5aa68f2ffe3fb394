"""``hvd.HorovodInternalError``: what a collective raises when the ranks disagree about it; and
the ``ValueError`` for a rank's own wrong arguments."""

from __future__ import annotations

from sparktrain.errors import SparkTrainError


class HorovodInternalError(SparkTrainError, RuntimeError):
    """A collective could not run: the ranks passed it inputs that do not fit together.

    Raised on every rank that took part, before any data moved, as Horovod's
    ``HorovodInternalError`` is (a ``RuntimeError``); the process group stays usable, so the
    ranks can go on with further collectives.
    """


class InvalidArgumentError(SparkTrainError, ValueError):
    """A collective's own arguments are wrong on this rank (``alltoall``'s splits), refused as
    Horovod refuses them: a ``ValueError`` on the rank that passed them. The other ranks of the
    collective raise :class:`HorovodInternalError` naming that rank; nothing is sent.
    """


class HostsUpdatedInterrupt(SparkTrainError, RuntimeError):
    """sparktrain asked the ranks to stop (``sparktrain.should_stop()``), seen at a commit.

    Raised on every rank together by ``state.check_host_updates()`` (so by ``state.commit()``),
    as Horovod's is when hosts are added or removed. Here the ranks are processes of one
    attempt: ``hvd.elastic.run`` ends this one after the commit, and sparktrain launches the
    run again (e.g. larger, for an elastic run that grows), from that commit.

    Args:
        skip_sync: as in Horovod, whether the state may skip its sync after the reset.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__(
            "sparktrain asked the ranks to stop (a resize, a preemption or a cancellation): "
            "this attempt ends after the commit, and the next one resumes from it"
        )
        self.skip_sync = skip_sync
