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
