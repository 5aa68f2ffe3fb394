"""torch.distributed backend: the ``env://`` rendezvous variables, nothing to start."""

from __future__ import annotations

from collections.abc import Mapping

from sparktrain.backends.base import Backend, interface_env
from sparktrain.cluster import ClusterSpec, RankSpec
from sparktrain.config import RunConfig
from sparktrain.errors import ConfigurationError

# A collective that times out (init_process_group's timeout, 10 minutes for NCCL by default)
# or fails ends the rank's process instead of leaving it blocked, as torchrun sets it. Each
# value is set under the first of its names unless any of them (older torch reads the later
# ones) is set already.
COLLECTIVE_DEFAULTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"), "1"),
)


class TorchBackend(Backend):
    """``dist.init_process_group(sparktrain.default_backend())`` works with no arguments."""

    name = "torch"

    def check(self, config: RunConfig) -> None:
        if config.launcher not in (None, "torch"):
            raise ConfigurationError(
                f"launcher={config.launcher!r} is a Horovod setting; the torch backend starts "
                "one process per rank itself (leave launcher unset, or use backend='horovod')"
            )

    def env(
        self, spec: ClusterSpec, rank: RankSpec, shared: Mapping[str, str], config: RunConfig
    ) -> dict[str, str]:
        env = {
            "MASTER_ADDR": spec.master_addr,
            "MASTER_PORT": str(spec.master_port),
        }
        env.update(interface_env(rank))
        return env

    def env_defaults(self, env: Mapping[str, str]) -> dict[str, str]:
        return {
            names[0]: value for names, value in COLLECTIVE_DEFAULTS if env.keys().isdisjoint(names)
        }
