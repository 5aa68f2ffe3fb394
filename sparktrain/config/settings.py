"""RunConfig: the declaration of every setting (its default, Spark conf key, kind and meaning)
and how a run's values are resolved from defaults, Spark conf, environment and arguments."""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from typing import Any

from sparktrain.config.checks import (
    HOROVOD_IMPLS,
    NICS_HINT,
    NODE_RULES,
    NODE_WHY,
    QUEUE_WAIT,
    STALL_ACTIONS,
    VERBOSITIES,
    check,
    environment,
    world_size,
)
from sparktrain.config.keys import (
    CONF_PREFIX,
    conf_key_of,
    env_key,
    parse_text,
    parser,
    setting,
    settings_of,
)
from sparktrain.config.mpi_args import parse_mpi_args
from sparktrain.config.validators import (
    SECONDS,
    at_least,
    boolean,
    choice,
    duration,
    parsed,
    size,
    string,
)
from sparktrain.errors import ConfigurationError
from sparktrain.units import parse_names


def conf_key(field: str) -> str:
    """The Spark conf key of a field, e.g. ``spark.sparktrain.startTimeout``.

    Raises:
        KeyError: for a field that only a keyword argument sets (``np``, ``env``).
    """
    return conf_key_of(RunConfig, field)


def conf_keys() -> list[str]:
    """The Spark conf key of every setting the Spark conf can set."""
    return [CONF_PREFIX + str(s.metadata["key"]) for s in settings_of(RunConfig)]


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every setting of one ``run()``; immutable and validated on construction.

    Build it with :meth:`resolve` so defaults, Spark conf and env are applied; the
    constructor alone validates what it is given.
    """

    np: int = dataclasses.field(metadata={"check": world_size})
    backend: str = setting(
        "torch",
        "backend",
        "str",
        "how the ranks find each other: torch or horovod.",
        check=string(),
    )
    driver_log_verbosity: str = setting(
        "all",
        "driverLogVerbosity",
        "str",
        "all streams every rank's output to the driver; log_callback_only only log_to_driver() "
        "messages (and failed ranks' output, in the error).",
        check=choice(VERBOSITIES),
    )
    start_timeout: float = setting(
        120.0,
        "startTimeout",
        "duration",
        "how long every rank has to reach the rendezvous.",
        check=duration(),
    )
    timeout: float | None = setting(
        None,
        "timeout",
        "duration",
        "how long the whole run may take.",
        unset="none",
        check=duration(unset="none"),
    )
    stall_timeout: float | None = setting(
        300.0,
        "stallTimeout",
        "duration",
        "when no rank has entered or left a collective for this long while some wait in one "
        "for ranks that are outside any and silent (or that entered fewer), the run is hung "
        "and ends with RunHungError naming the ranks behind, with every rank's stack; a long "
        "computation outside collectives is not. When no rank has printed or reported "
        "anything for this long, the run is stalled: every rank's stack is shown (off: "
        "neither). 5 minutes outlasts a normal wait in a collective (a slow first NCCL "
        "set-up, a peer's checkpoint save) and comes before NCCL's 10-minute watchdog and "
        "Gloo's 30-minute timeout.",
        unset="off",
        check=duration(unset="off", what=SECONDS + " or 'off'"),
    )
    stall_action: str = setting(
        "warn",
        "stallAction",
        "str",
        "what a stall (silence) does besides showing the stacks: warn (nothing more; shown "
        "again after the next silence) or fail (stop the run with RunStalledError, which "
        "maxRestarts restarts). A hang in collectives always ends the run.",
        check=choice(STALL_ACTIONS),
    )
    capacity_wait: float = setting(
        60.0,
        "capacityWait",
        "duration",
        "how long a freshly started session may take to register executors before a run is "
        "refused for lack of task slots; where the application's settings give it the slots, "
        "how long a run waits for the executors still missing (again after each that "
        "registers).",
        check=duration(),
    )
    queue_wait: float | None = setting(
        None,
        "queueWait",
        "duration",
        "how long a run waits its turn while other runs of this driver process hold the task "
        "slots it needs (runs start in the order they were submitted); 0 refuses it at once "
        "with CapacityError; none waits as long as the runs ahead of it take.",
        unset="none",
        check=duration(unset="none", zero=True, what=QUEUE_WAIT),
    )
    grace_period: float = setting(
        10.0,
        "gracePeriod",
        "duration",
        "time between SIGTERM and SIGKILL when ranks are stopped.",
        check=duration(),
    )
    env: Mapping[str, str] = dataclasses.field(
        default_factory=dict, metadata={"check": environment}
    )
    use_gpu: bool | None = setting(
        None,
        "useGpu",
        "bool",
        "false hides GPUs from the ranks; auto gives each rank the GPU assigned to it, if any; "
        "true also refuses to run ranks on the driver without one GPU each.",
        unset="auto",
        check=boolean(allow_none=True),
    )
    node: str = setting(
        "auto",
        "node",
        "str",
        "what a node is for LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK and "
        "hvd.local_rank(): host (the ranks of a host are one node), task (every Spark task is "
        "a node of its own, as under TorchDistributor) or auto (host, except where tasks on one "
        "host each number their GPUs from 0, as containers do: task). Device "
        "cuda:{LOCAL_RANK} is the rank's own GPU whichever it is.",
        check=choice(NODE_RULES, why=NODE_WHY),
    )
    warm_start: bool = setting(
        True,
        "warmStart",
        "bool",
        "fork each rank from a process of its task's Python worker that already imported "
        "torch and sparktrain (kept while that worker lives, at most 10 minutes unused); "
        "false starts every rank in a new interpreter.",
        check=boolean(),
    )
    max_payload_bytes: int = setting(
        256 << 20,
        "maxPayloadBytes",
        "size",
        "largest pickled function and arguments.",
        check=size(),
    )
    ship_modules: bool = setting(
        True,
        "shipModules",
        "bool",
        "send the modules of your own that the function imports (or a script: those of its "
        "folder) with the run, as source files the ranks import: those in the driver's "
        "working folder, outside the Python installation and any site-packages; false sends "
        "none (install them on the executors, or use addPyFile).",
        check=boolean(),
    )
    max_module_bytes: int = setting(
        16 << 20,
        "maxModuleBytes",
        "size",
        "largest total size of the module files that shipModules sends with a run.",
        check=size(),
    )
    max_result_bytes: int = setting(
        256 << 20,
        "maxResultBytes",
        "size",
        "largest pickled result of rank 0 (of every rank's together, for run_all).",
        check=size(),
    )
    kept_results_ttl: float | None = setting(
        3 * 86400.0,
        "keptResultsTtl",
        "duration",
        "how long a result that could not be returned stays kept on its host: the first run "
        "on that host after this removes it (sparktrain kept clean removes kept results at "
        "once); none keeps them until removed by hand.",
        unset="none",
        check=duration(unset="none"),
    )
    resize_interval: float = setting(
        60.0,
        "resizeInterval",
        "duration",
        "for an elastic run (np=(min, max)) below max, the least time between two looks for "
        "free task slots to grow into; a look is taken when rank 0 saves a checkpoint.",
        check=duration(),
    )
    elastic_grow: bool = setting(
        True,
        "elasticGrow",
        "bool",
        "whether an elastic run (np=(min, max)) below max grows back: after a checkpoint is "
        "saved while more task slots are free, its ranks are stopped and launched again "
        "larger (not counted against maxRestarts); false keeps the size it has.",
        check=boolean(),
    )
    max_restarts: int = setting(
        0,
        "maxRestarts",
        "int",
        "whole-run launches after a rank is lost (killed, executor lost, rendezvous timeout).",
        check=at_least(0),
    )
    restart_on_user_error: bool = setting(
        False,
        "restartOnUserError",
        "bool",
        "also restart (up to maxRestarts) after an exception raised by the function.",
        check=boolean(),
    )
    launcher: str | None = setting(
        None,
        "launcher",
        "str",
        "who starts the ranks of backend horovod: gloo (sparktrain does; auto) or mpi (mpirun).",
        unset="auto",
        check=string(allow_none=True),
    )
    extra_mpi_args: tuple[str, ...] | None = setting(
        None,
        "extraMpiArgs",
        "args",
        "more arguments for mpirun with launcher mpi, as on a command line (e.g. "
        "-x NCCL_DEBUG=INFO --bind-to none); never run through a shell.",
        unset="none",
        check=parsed(parse_mpi_args),
    )
    nics: tuple[str, ...] | None = setting(
        None,
        "nics",
        "names",
        "network interfaces the ranks talk over, in order of preference (e.g. eth0 or "
        "ib0,eth0); auto probes each host's interfaces and takes one that reaches every other "
        "host, preferring the one that holds the executor's address.",
        unset="auto",
        check=parsed(parse_names, none_if_empty=True, hint=NICS_HINT, example=" eth0,ib0"),
    )
    ignore_ssl: bool = setting(
        False,
        "ignoreSsl",
        "bool",
        "run on a cluster with spark.ssl.enabled=true, although what the ranks send each other "
        "(torch.distributed, Gloo, NCCL, Horovod, MPI) is not encrypted; see the Security page "
        "of the documentation (docs/security.md).",
        check=boolean(),
    )
    horovod_impl: str | None = setting(
        None,
        "horovodImpl",
        "str",
        "which horovod.torch the ranks of backend horovod import: horovod (the installed "
        "Horovod), builtin (sparktrain's own, on torch.distributed; the installed Horovod is "
        "shadowed on the ranks only) or auto (Horovod where it is installed, else builtin).",
        unset="auto",
        check=choice(HOROVOD_IMPLS, unset="auto"),
    )

    client_address: str | None = setting(
        None,
        "clientAddress",
        "str",
        "under Spark Connect, the address executors use to reach this client's channel "
        "(auto: the address this machine uses to reach the Connect server).",
        unset="auto",
        check=string(allow_none=True, non_empty=True),
    )
    client_reachable: bool | None = setting(
        None,
        "clientReachable",
        "bool",
        "under Spark Connect, whether executors can reach this client: auto lets the first "
        "run's tasks find out (if they cannot, the run starts again detached); false sends "
        "results and failures back through the Spark job alone (no live logs or progress; "
        "see logDir); true makes a task that cannot reach it an error.",
        unset="auto",
        check=boolean(allow_none=True),
    )
    log_dir: str | None = setting(
        None,
        "logDir",
        "str",
        "a folder every executor can write and the client can read (shared storage): each "
        "rank also writes its output to <logDir>/<run id>/attempt-<n>/rank-<r>.log; the way to "
        "see logs when executors cannot reach the client.",
        unset="none",
        check=string(allow_none=True, non_empty=True),
    )

    # The sizes an elastic run may take, (min, max): np=(min, max) gives it, np is then the
    # size of the attempt at hand (max until one is chosen). None: np ranks, always.
    elastic: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        check(self)

    @property
    def local(self) -> bool:
        """True when the ranks run on the driver (np < 0)."""
        return self.np < 0

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return abs(self.np)

    @classmethod
    def resolve(
        cls,
        np: int | tuple[int, int],
        overrides: Mapping[str, Any] | None = None,
        spark_conf: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> RunConfig:
        """Build a config: field defaults < Spark conf < environment < ``overrides``.

        Args:
            np: number of ranks (negative: on the driver), or ``(min, max)`` for an elastic
                run on Spark (see :func:`sparktrain.config.checks.elastic_sizes`).
            overrides: keyword arguments given to the runner; ``None`` values mean "default".
            spark_conf: the session's ``spark.sparktrain.*`` entries, when there is a session.
            environ: the environment to read ``SPARKTRAIN_*`` from (default ``os.environ``).

        Raises:
            ConfigurationError: for any invalid value, naming where it came from.
        """
        values: dict[str, Any] = {}
        conf = spark_conf or {}
        env = os.environ if environ is None else environ
        for field in settings_of(cls):
            parse = parser(field)
            key, variable = conf_key(field.name), env_key(field.name)
            if key in conf:
                values[field.name] = parse_text(parse, conf[key], f"{key} in Spark conf")
            if variable in env:
                values[field.name] = parse_text(parse, env[variable], variable)
        for name, value in (overrides or {}).items():
            if name not in {f.name for f in dataclasses.fields(cls)} or name in ("np", "elastic"):
                raise ConfigurationError(_unknown(name, cls))
            if value is not None:
                values[name] = value
        return cls(np=np, **values)  # type: ignore[arg-type]  # a tuple np is checked there

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict, for shipping to tasks."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["env"] = dict(self.env)
        if self.elastic is not None:
            data["elastic"] = list(self.elastic)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunConfig:
        """Inverse of :meth:`to_json`."""
        return cls(**data)


def _unknown(name: str, cls: type[RunConfig]) -> str:
    """The error for a setting that does not exist: the nearest one, when one is near."""
    names = [f.name for f in dataclasses.fields(cls) if f.name != "np"]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if close:
        return f"unknown setting {name!r} (did you mean {close[0]!r}?)"
    return f"unknown setting {name!r}; the settings are: {', '.join(sorted(names))}"
