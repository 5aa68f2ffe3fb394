"""``python -m sparktrain.task.mpi.guard COMMAND...``: run a launcher that must die with its task.

mpirun and Open MPI's daemon do not know the supervisor's lifeline pipe (see
:class:`~sparktrain.task.process.RankProcess`), and they close every inherited descriptor
in the ranks they start. The guard holds the lifeline in their place: it runs the command in
its own process group and SIGKILLs the group the moment the pipe reports the supervisor
gone. The ranks, which mpirun puts in process groups of their own, die with their launcher
through ``PR_SET_PDEATHSIG`` (set by the worker bootstrap).

SIGTERM, SIGINT and SIGHUP reach the whole group from the supervisor; the guard leaves them
to the command (mpirun stops its job on SIGTERM) and exits with its status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from sparktrain import contract
from sparktrain.worker.bootstrap import watch_lifeline


def main(argv: list[str] | None = None) -> int:
    """Run ``argv`` (default: this program's arguments); returns its shell-style status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m sparktrain.task.mpi.guard COMMAND...", file=sys.stderr)
        return 2
    fd_text = os.environ.pop(contract.PARENT_FD_ENV, None)
    if fd_text:
        grace = float(os.environ.get(contract.GRACE_ENV, "10"))
        watch_lifeline(int(fd_text), grace, "sparktrain-guard")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A Python handler, not SIG_IGN: the command must get default dispositions at exec.
        signal.signal(sig, lambda signum, frame: None)
    child = subprocess.Popen(args, close_fds=True)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries; belt and braces
            continue
    return contract.shell_status(code)


if __name__ == "__main__":
    sys.exit(main())
