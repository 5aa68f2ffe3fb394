"""The mpirun command line, and reading its output back: pure functions, no processes.

The unit tests cover these with tables; the processes are :mod:`sparktrain.task.mpi.mpi_launcher`'s.

How ranks line up: ``-H host0:n0,host1:n1,... -map-by slot`` fills hosts in list order, so
``OMPI_COMM_WORLD_RANK`` follows the ClusterSpec (ranks contiguous per host, hosts in
node-rank order) and is sparktrain's ``RANK``. Every rank's sparktrain environment is handed
to the processes of its host as one table keyed by global rank
(:data:`sparktrain.contract.MPI_RANK_TABLE_ENV`); the worker picks its row by
``OMPI_COMM_WORLD_RANK``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence

from sparktrain.layout.cluster import ClusterSpec

RSH_MODULE = "sparktrain.task.mpi.rsh"
GUARD_MODULE = "sparktrain.task.mpi.guard"
# Seconds Open MPI waits between the signals it stops ranks with (odls_base_sigkill_timeout).
KILL_STEP = 1

# "[jobid,rank]<stdout>:" — what --tag-output puts before every chunk a rank writes.
_TAG = re.compile(r"\[\d+,(\d+)\]<(?:stdout|stderr|stddiag)>:")
# "Process name: [[6524,1],1]" then "Exit code:    3" (a rank exited non-zero).
_PROCESS_NAME = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_EXIT_CODE = re.compile(r"Exit code:\s*(-?\d+)")
# "mpirun noticed that process rank 1 with PID 30312 on node h exited on signal 9 (Killed)."
_SIGNALED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")


def mpirun_command(
    spec: ClusterSpec,
    *,
    python: str | None = None,
    mpirun: str | None = None,
    as_root: bool | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The mpirun command that starts one ``python -m sparktrain.worker`` per rank of ``spec``.

    Remote hosts' daemons are started by mpirun's remote-shell agent, which is sparktrain's
    (``python -m sparktrain.task.mpi.rsh``): it asks the barrier task on that host to start the
    daemon, so executors need no SSH. ``plm_rsh_no_tree_spawn`` makes mpirun start every
    daemon itself (only its environment knows the tasks' addresses) and
    ``--leave-session-attached`` keeps each daemon in the foreground, owned by its task.

    Args:
        spec: the job's layout; its hosts, in node-rank order, become ``-H host:slots``.
        python: the interpreter for ranks and for the agent (default: this one).
        mpirun: the mpirun executable (default: the one on PATH).
        as_root: add ``--allow-run-as-root`` (default: when running as root).
        extra: the user's ``extra_mpi_args`` (checked by RunConfig), placed after
            sparktrain's own flags and before the program.

    Returns:
        The argv list.
    """
    python = python or sys.executable
    mpirun = mpirun or shutil.which("mpirun") or "mpirun"
    if as_root is None:
        as_root = os.geteuid() == 0
    hosts = ",".join(f"{host}:{slots}" for host, slots in spec.hosts())
    argv = [mpirun]
    if as_root:
        argv.append("--allow-run-as-root")
    argv += [
        "-np",
        str(spec.world_size),
        "-H",
        hosts,
        "-bind-to",
        "none",
        "-map-by",
        "slot",
        "--tag-output",
        "--leave-session-attached",
        "-mca",
        "plm_rsh_agent",
        f"{python} -m {RSH_MODULE}",
        "-mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "-mca",
        "orte_keep_fqdn_hostnames",
        "1",
        # When a rank fails, Open MPI stops the others with SIGCONT, a wait, SIGTERM, the
        # same wait again and SIGKILL, waiting even for ranks long gone: one second each.
        # A stop that sparktrain asks for gives the ranks grace_period itself
        # (MpiRun.terminate) before mpirun is told.
        "-mca",
        "odls_base_sigkill_timeout",
        str(KILL_STEP),
    ]
    ifnames = {r.task.ifname for r in spec.ranks}
    if spec.num_hosts > 1 and len(ifnames) == 1 and None not in ifnames:
        # One interface name everywhere: keep MPI's TCP traffic on the one Spark uses.
        name = str(next(iter(ifnames)))
        argv += ["-mca", "btl_tcp_if_include", name, "-mca", "oob_tcp_if_include", name]
    argv += [*extra, python, "-m", "sparktrain.worker"]
    return argv


def peer_for(host: str, peers: Mapping[str, str]) -> str | None:
    """The task address serving ``host``; mpirun may shorten a host name to its first label."""
    if host in peers:
        return peers[host]
    matches = [
        addr
        for name, addr in peers.items()
        if name.split(".")[0] == host.split(".")[0] and not _is_ip(name)
    ]
    return matches[0] if len(matches) == 1 else None


def _is_ip(name: str) -> bool:
    return bool(re.fullmatch(r"[\d.]+|[0-9a-fA-F:]*:[0-9a-fA-F:.]*", name))


class TagSplitter:
    """Turns mpirun's ``--tag-output`` stream back into whole lines per rank.

    mpirun tags each chunk a rank writes, not each line: an unbuffered Python rank's
    ``print(a, b)`` arrives as several tagged pieces, and pieces of different ranks may share
    a physical line. A tag's text belongs to its rank until the next tag; the newline that
    ends a physical line ends the line of the last rank tagged on it. Text before the first
    tag of a line is mpirun's own.
    """

    def __init__(self) -> None:
        self._partial: dict[int, str] = {}

    def feed(self, line: str) -> Iterator[tuple[int | None, str]]:
        """One physical line of mpirun's output; yields ``(rank or None, line)`` completed."""
        pieces = _TAG.split(line)
        # pieces: [untagged, rank, text, rank, text, ...]
        head = pieces[0]
        if len(pieces) == 1:
            yield None, head
            return
        if head.strip():
            yield None, head
        pairs = list(zip(pieces[1::2], pieces[2::2], strict=True))
        for i, (rank_text, text) in enumerate(pairs):
            rank = int(rank_text)
            self._partial[rank] = self._partial.get(rank, "") + text
            if i == len(pairs) - 1:
                yield rank, self._partial.pop(rank)

    def flush(self) -> Iterator[tuple[int, str]]:
        """Whatever ranks wrote without a final newline."""
        partial, self._partial = self._partial, {}
        for rank, text in sorted(partial.items()):
            if text:
                yield rank, text


def parse_exits(lines: Iterable[str]) -> dict[int, int]:
    """Ranks that mpirun says ended abnormally: rank -> exit code (negative: signal).

    mpirun names the first rank that exited non-zero (``Process name: [[job,1],rank]`` then
    ``Exit code: N``) or was killed (``process rank R ... exited on signal S``).
    """
    exits: dict[int, int] = {}
    pending: int | None = None
    for line in lines:
        signaled = _SIGNALED.search(line)
        if signaled:
            exits.setdefault(int(signaled.group(1)), -int(signaled.group(2)))
            continue
        name = _PROCESS_NAME.search(line)
        if name:
            pending = int(name.group(1))
            continue
        code = _EXIT_CODE.search(line)
        if code and pending is not None:
            exits.setdefault(pending, int(code.group(1)))
            pending = None
    return exits


def hosts_needing_daemons(spec: ClusterSpec) -> list[str]:
    """Hosts other than rank 0's: mpirun starts a daemon on each through the agent."""
    first = spec.first.task.host
    return [host for host, _ in spec.hosts() if host != first]


def first_task_on(spec: ClusterSpec, host: str) -> int:
    """Partition index of the task with local rank 0 on ``host`` (it serves that host)."""
    return spec.on_host(host)[0].task.index
