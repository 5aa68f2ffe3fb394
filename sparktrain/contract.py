"""Names that cross a process boundary: environment variables, file names and exit codes.

A task's supervisor, mpirun's remote-shell agent, the guard and the worker process each run
in an interpreter of their own; what one writes and another reads is spelled here, once.
This module imports nothing of sparktrain's, so every side can import it cheaply.

Variables whose names start with ``_SPARKTRAIN_`` are private to sparktrain's processes;
``SPARKTRAIN_ATTEMPT`` is public (user code may read it through ``sparktrain.attempt()``).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from pathlib import Path

# -- what every worker process gets from its supervisor ----------------------------------------
# The pickled function and arguments.
PAYLOAD_ENV = "_SPARKTRAIN_PAYLOAD"
# Where a rank writes its pickled result: rank 0's, and every rank's for ``run_all`` (unset on
# ranks whose value is not asked for).
RESULT_ENV = "_SPARKTRAIN_RESULT"
# Where a rank writes its JSON error record when it fails in Python.
ERROR_ENV = "_SPARKTRAIN_ERROR"
# Where a rank that returned writes when it began, called the function, got its value back
# and had written its result (JSON, wall clock): the run's record shows where time went.
TIMES_ENV = "_SPARKTRAIN_TIMES"
# The folder a rank starts in: its task's working directory (under mpirun, which may start
# ranks elsewhere, the worker changes to it).
TASK_CWD_ENV = "_SPARKTRAIN_CWD"
# The task's SparkFiles root (files and archives shipped with addFile / --files / --archives),
# so that pyspark's SparkFiles.get works inside a rank.
SPARK_FILES_ENV = "_SPARKTRAIN_SPARK_FILES"
# A rank's collective counters: a file of COLLECTIVE_SLOT_BYTES that its task made (two
# native-endian unsigned 64-bit counts, collectives entered and completed), which the rank maps
# and moves and the task reads for the driver's hang watch (unset: nothing is counted).
COLLECTIVES_ENV = "_SPARKTRAIN_COLLECTIVES"
COLLECTIVE_SLOT_BYTES = 16
# Most seconds between two reads of the counters by the task (and between two looks of the
# driver's hang watch at them once they have been still: a look more often than the counts
# can arrive would see nothing new); a quarter of stall_timeout when that is shorter.
COLLECTIVES_EVERY_S = 10.0
# Largest pickled result rank 0 may write, in bytes.
MAX_RESULT_ENV = "_SPARKTRAIN_MAX_RESULT"
# The index, within CUDA_VISIBLE_DEVICES, of the rank's own GPU.
DEVICE_INDEX_ENV = "_SPARKTRAIN_DEVICE_INDEX"
# "0" when the rank must not use CUDA (no GPU assigned, or use_gpu=False).
USE_GPU_ENV = "_SPARKTRAIN_USE_GPU"
# The address of the rank's host, and of rank 0's, as the tasks gave them at rendezvous.
HOST_ENV = "_SPARKTRAIN_HOST"
RANK0_HOST_ENV = "_SPARKTRAIN_RANK0_HOST"
# The number of hosts the ranks run on (LOCAL_WORLD_SIZE counts a node, which may be a task).
NUM_HOSTS_ENV = "_SPARKTRAIN_NUM_HOSTS"
# The run's start_timeout: how long a rank waits for its peers where they meet on their own
# (a directory declared shared, see sparktrain.worker.shared_paths).
START_TIMEOUT_ENV = "_SPARKTRAIN_START_TIMEOUT"
# The read end of the supervisor's lifeline pipe: EOF means the supervisor is gone.
PARENT_FD_ENV = "_SPARKTRAIN_PARENT_FD"
# Seconds between SIGTERM and SIGKILL when a process group is stopped.
GRACE_ENV = "_SPARKTRAIN_GRACE"
# ``host:port`` of the driver's channel, and the run's key (hex) to authenticate to it.
CHANNEL_ENV = "_SPARKTRAIN_CHANNEL"
KEY_ENV = "_SPARKTRAIN_KEY"
# A run given a DataFrame (``sparktrain.data.from_dataframe``): the task's stream socket, this
# rank's index among the ranks it feeds, and where the rank may spill (a local folder).
STREAM_ENV = "_SPARKTRAIN_STREAM"
STREAM_INDEX_ENV = "_SPARKTRAIN_STREAM_INDEX"
STREAM_DIR_ENV = "_SPARKTRAIN_STREAM_DIR"
# Same for every attempt of one run (checkpoint ownership relies on it).
RUN_ID_ENV = "_SPARKTRAIN_RUN_ID"
# Which launch of the run this is: 0, then one more per restart.
ATTEMPT_ENV = "SPARKTRAIN_ATTEMPT"
# Set to 1 on every rank of an elastic run (np=(min, max)), whose WORLD_SIZE may differ from
# one attempt to the next; with the previous attempt's WORLD_SIZE (the same on the first), so
# the function can rescale its learning rate or per-rank batch.
ELASTIC_ENV = "SPARKTRAIN_ELASTIC"
PREVIOUS_WORLD_SIZE_ENV = "SPARKTRAIN_PREVIOUS_WORLD_SIZE"
# The write end of the supervisor's stack pipe: the worker's faulthandler dumps its threads'
# stacks there on STACK_SIGNAL, after one header line (see stack_header).
STACK_FD_ENV = "_SPARKTRAIN_STACK_FD"
STACK_SIGNAL = signal.SIGUSR1
# Set to 1 on a rank with GPUs: on STACK_SIGNAL it also writes torch's NCCL flight recorder
# trace (see sparktrain.worker.nccl_trace), into NCCL_TRACE_DIR_ENV when set (the rank's log
# folder), and prints one line starting with NCCL_TRACE_NOTE that names the file or says why
# there is none; its task waits for that line before stopping it.
NCCL_TRACE_ENV = "_SPARKTRAIN_NCCL_TRACE"
NCCL_TRACE_DIR_ENV = "_SPARKTRAIN_NCCL_TRACE_DIR"
NCCL_TRACE_NOTE = "sparktrain: this rank's NCCL flight recorder trace"
# Set (to why, e.g. "Horovod is not installed") when ``import horovod`` on the rank must give
# sparktrain's built-in horovod.torch: the worker then puts its shim first on sys.path.
HOROVOD_SHIM_ENV = "_SPARKTRAIN_HOROVOD_SHIM"
# That shim: the folder, inside the package, that holds a package named ``horovod`` (see
# sparktrain.hvdcompat). Spelled here so that the worker finds it without importing hvdcompat,
# whose elastic API imports the worker's context.
HOROVOD_SHIM_DIR = Path(__file__).resolve().parent / "hvdcompat" / "shim"
# Set to 1 when rank 0 must make the process group's store listen on MASTER_ADDR alone (a
# loopback address, for ``np < 0``) rather than on every interface, as torch's does.
BOUND_STORE_ENV = "_SPARKTRAIN_BOUND_STORE"

# -- warm starts (see sparktrain.worker.zygote) -------------------------------------------------
# The fd of the Unix socket a zygote serves its owner on, and its idle lifetime in seconds.
ZYGOTE_FD_ENV = "_SPARKTRAIN_ZYGOTE_FD"
ZYGOTE_IDLE_ENV = "_SPARKTRAIN_ZYGOTE_IDLE"
# A zygote shared by an executor's Python workers: the path it listens on once loaded, and
# the fd of a pidfd of the process it lives no longer than (the executor's Python daemon).
ZYGOTE_SHARE_ENV = "_SPARKTRAIN_ZYGOTE_SHARE"
ZYGOTE_ANCHOR_FD_ENV = "_SPARKTRAIN_ZYGOTE_ANCHOR_FD"
# Seconds a shared zygote waits for a new owner once its last one went away.
ZYGOTE_UNOWNED_ENV = "_SPARKTRAIN_ZYGOTE_UNOWNED"
# The fd a zygote waits to see end (EOF) before it loads: its task's connection to the driver,
# which the driver closes once it has the task's output.
ZYGOTE_HOLD_FD_ENV = "_SPARKTRAIN_ZYGOTE_HOLD_FD"
# torchrun's one role: every rank's ROLE_NAME.
ROLE_NAME = "default"
# Where a rank is: what torch.distributed's env:// rendezvous and launchers read, with the
# variables torchrun sets beside them (which make frameworks recognise a torchrun launch).
TORCHRUN_VARIABLES = frozenset(
    {
        "GROUP_WORLD_SIZE",
        "ROLE_NAME",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_USE_AGENT_STORE",
    }
)
PLACE_VARIABLES = (
    frozenset(
        {
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "NODE_RANK",
            "GROUP_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
        }
    )
    | TORCHRUN_VARIABLES
)
# Variables a rank reads only once its function runs (when CUDA, a process group, NCCL, Gloo
# or Horovod first start), so a rank forked from a zygote may get them after the fork. Every
# other variable is read while Python, torch and sparktrain load, and must match the zygote's.
LATE_VARIABLES = PLACE_VARIABLES | {
    "CUDA_VISIBLE_DEVICES",
    ATTEMPT_ENV,
    ELASTIC_ENV,
    PREVIOUS_WORLD_SIZE_ENV,
}
LATE_PREFIXES = ("_SPARKTRAIN_", "NCCL_", "GLOO_", "HOROVOD_", "TORCHELASTIC_")


def late_variable(name: str) -> bool:
    """Whether a rank reads ``name`` only once its function runs (see LATE_VARIABLES)."""
    return name in LATE_VARIABLES or name.startswith(LATE_PREFIXES)


# -- launcher="mpi" ----------------------------------------------------------------------------
# A JSON object {global rank: {env var: value}} for the ranks of one host (see rank_table).
MPI_RANK_TABLE_ENV = "_SPARKTRAIN_MPI_RANKS"
# The task folder where a host's MPI ranks write their error files (and rank 0 its result).
OUTCOME_DIR_ENV = "_SPARKTRAIN_OUTCOME_DIR"
# JSON object {host name as given to mpirun: "address:port" of the task that serves it}.
RSH_PEERS_ENV = "_SPARKTRAIN_RSH_PEERS"
# Set by mpirun in every rank it starts.
OMPI_RANK_ENV = "OMPI_COMM_WORLD_RANK"
OMPI_SIZE_ENV = "OMPI_COMM_WORLD_SIZE"

# -- files in a task's own folder (not the ranks' working directory) ---------------------------
PAYLOAD_FILE = "payload.pkl"
RESULT_FILE = "result.pkl"


def result_file_name(rank: int) -> str:
    """The file a rank writes its pickled result to (rank 0's is :data:`RESULT_FILE`)."""
    return RESULT_FILE if rank == 0 else f"result-{rank}.pkl"


def error_file_name(rank: int) -> str:
    """The file a rank writes its JSON error record to."""
    return f"error-{rank}.json"


def times_file_name(rank: int) -> str:
    """The file a rank writes its timestamps to (see TIMES_ENV)."""
    return f"times-{rank}.json"


def collectives_interval(stall_timeout: float) -> float:
    """Seconds between two reads of the collective counters, for ``stall_timeout``."""
    return min(COLLECTIVES_EVERY_S, stall_timeout / 4)


def collectives_file_name(rank: int) -> str:
    """The file of a rank's collective counters (see COLLECTIVES_ENV)."""
    return f"collectives-{rank}"


def pid_file_name(rank: int) -> str:
    """The file an MPI rank writes its pid to, so its task can reap it."""
    return f"rank-{rank}.pid"


# -- stack dumps -------------------------------------------------------------------------------
_STACK_HEADER = "sparktrain-stacks"


def stack_header(main_thread: int, root: str) -> str:
    """The line a worker writes to its stack pipe once its dump handler is registered.

    Args:
        main_thread: the main thread's ident, as faulthandler prints it in its dumps.
        root: the name of the main thread's outermost function (the last frame of its
            section in a complete dump).
    """
    return f"{_STACK_HEADER} main=0x{main_thread:x} root={root}\n"


def parse_stack_header(line: str) -> tuple[int, str] | None:
    """Inverse of :func:`stack_header` (without its newline); None for any other line."""
    name, _, rest = line.strip().partition(" ")
    fields = {}
    for part in rest.split(" "):
        key, _, value = part.partition("=")
        fields[key] = value
    if name != _STACK_HEADER or "main" not in fields or "root" not in fields:
        return None
    try:
        return int(fields["main"], 16), fields["root"]
    except ValueError:
        return None


# -- exit codes --------------------------------------------------------------------------------
# A worker whose function raised, or that could not load it.
EXIT_FAILED = 1
# ssh's exit status when the connection fails; mpirun reports it as a failed daemon launch.
EXIT_CONNECTION_FAILED = 255


def shell_status(code: int) -> int:
    """A process exit code as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else code


def rank_table(envs: Mapping[int, Mapping[str, str]]) -> str:
    """The value of :data:`MPI_RANK_TABLE_ENV` for these ranks' environments."""
    return json.dumps({str(rank): dict(env) for rank, env in envs.items()}, sort_keys=True)


def parse_rank_table(text: str) -> dict[int, dict[str, str]]:
    """Inverse of :func:`rank_table`."""
    return {int(rank): dict(env) for rank, env in json.loads(text).items()}
