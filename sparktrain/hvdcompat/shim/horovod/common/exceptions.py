"""``horovod.common.exceptions``: the exceptions elastic scripts catch."""

from sparktrain.hvdcompat.exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]
