"""``horovod.common.elastic``: the base states, for scripts that import them from here."""

from sparktrain.hvdcompat.elastic import ObjectState, State

__all__ = ["ObjectState", "State"]
