"""RunConfig: every setting of a run, validated once, from defaults, Spark conf, env and kwargs.

The built-in defaults are the field defaults of :class:`RunConfig` and nowhere else.
``sparktrain/defaults.conf``, shipped in the package as the settings' documentation, is
written from them by :func:`render_defaults_conf`; a unit test fails when the two differ.

The package's modules: ``keys`` (how a setting is declared, named and read as text),
``settings`` (:class:`RunConfig`: the declarations and how they are resolved),
``validators`` (the checks a setting declares with its field), ``checks`` (the validation
every RunConfig passes: each field's check, then the rules that join fields) and
``defaults_file``.
"""

from sparktrain.config.checks import (
    HOROVOD_IMPLS,
    MPI_TASK_NODES,
    NODE_RULES,
    PRIVATE_ENV_PREFIX,
    RESERVED_ENV,
    STALL_ACTIONS,
    VERBOSITIES,
)
from sparktrain.config.defaults_file import render_defaults_conf
from sparktrain.config.keys import CONF_PREFIX, ENV_PREFIX, env_key
from sparktrain.config.settings import RunConfig, conf_key, conf_keys

__all__ = [
    "CONF_PREFIX",
    "ENV_PREFIX",
    "HOROVOD_IMPLS",
    "MPI_TASK_NODES",
    "NODE_RULES",
    "PRIVATE_ENV_PREFIX",
    "RESERVED_ENV",
    "STALL_ACTIONS",
    "VERBOSITIES",
    "RunConfig",
    "conf_key",
    "conf_keys",
    "env_key",
    "render_defaults_conf",
]
