"""``extra_mpi_args``: the user's own mpirun flags, checked before they reach mpirun.

They are handed to mpirun as argv entries, never through a shell. Open MPI forwards some of
them (``-mca`` parameters) to the command line of its daemons, which mpirun's remote-shell
agent runs with ``/bin/sh -c`` on the other hosts, so every token is held to a character set
with no shell syntax. Flags that would change what sparktrain relies on (the number of
ranks, the hosts and the order of ranks on them, the remote-shell agent) are refused.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

# Letters, digits and the punctuation of flags, NAME=value pairs, paths, lists and
# interface patterns (``^lo,docker0``); nothing a shell would read as syntax.
_SAFE = re.compile(r"^[A-Za-z0-9_.,:=/+@%^-]+$")
# Flags sparktrain sets itself (``-np``, ``-H``, ``-map-by``) or that would replace them.
_OWN = {
    "-np": "the number of ranks (it is np)",
    "-n": "the number of ranks (it is np)",
    "-c": "the number of ranks (it is np)",
    "-H": "the hosts (they are the barrier tasks')",
    "-host": "the hosts (they are the barrier tasks')",
    "-hostfile": "the hosts (they are the barrier tasks')",
    "-machinefile": "the hosts (they are the barrier tasks')",
    "-default-hostfile": "the hosts (they are the barrier tasks')",
    "-map-by": "the order of ranks on hosts (it follows the barrier tasks)",
    "-rf": "the order of ranks on hosts (it follows the barrier tasks)",
    "-rankfile": "the order of ranks on hosts (it follows the barrier tasks)",
    "-npernode": "the number of ranks per host (it follows the barrier tasks)",
    "-npersocket": "the number of ranks per host (it follows the barrier tasks)",
    "-wdir": "the ranks' working directory (the task's own)",
    "-wd": "the ranks' working directory (the task's own)",
}
# MCA parameters that would replace sparktrain's remote-shell agent or its daemon layout.
_OWN_MCA = ("plm_rsh_agent", "plm_rsh_no_tree_spawn", "plm_rsh_args", "orte_launch_agent")
_MCA_FLAGS = ("-mca", "-gmca", "--mca", "--gmca")


def parse_mpi_args(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The checked mpirun arguments from a command-line string or a list of strings.

    Args:
        value: ``"-x NCCL_DEBUG=INFO --bind-to none"``, the same as a list, or None.

    Returns:
        The arguments, one token each (empty for None).

    Raises:
        ValueError: a token that is not a str, holds shell syntax, is a program rather than a
            flag or its value, or is a flag sparktrain sets itself; the message says which.
    """
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            tokens = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot split {value!r} into arguments: {exc}") from None
    elif isinstance(value, Sequence):
        tokens = list(value)
    else:
        raise ValueError(f"expected a string or a list of strings; got {type(value).__name__}")
    for token in tokens:
        if not isinstance(token, str):
            raise ValueError(f"every argument must be a str; got {token!r}")
        if not _SAFE.match(token):
            raise ValueError(
                f"{token!r} holds characters outside letters, digits and _ . , : = / + @ % ^ -; "
                "shell syntax is refused, because Open MPI passes some arguments on to its "
                "daemons' shell command line"
            )
    _check_flags(tokens)
    return tuple(tokens)


def _check_flags(tokens: list[str]) -> None:
    if tokens and not tokens[0].startswith("-"):
        raise ValueError(
            f"{tokens[0]!r} is not a flag: mpirun would run it as the program; extra "
            "arguments must start with a flag (e.g. -x NAME=value)"
        )
    for i, token in enumerate(tokens):
        flag = "-" + token.lstrip("-")
        if flag in _OWN:
            raise ValueError(f"{token} is sparktrain's to set: {_OWN[flag]}")
        if token in _MCA_FLAGS and i + 1 < len(tokens) and tokens[i + 1] in _OWN_MCA:
            raise ValueError(
                f"{token} {tokens[i + 1]} is sparktrain's to set: ranks on other hosts are "
                "started through the barrier tasks, without SSH"
            )
