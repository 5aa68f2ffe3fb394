"""The physical identity of a task's GPUs, so that the driver can tell one GPU given to two
tasks from GPUs that separate containers each number from 0."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

# nvidia-smi answers in well under a second; a hung driver must not hold the rendezvous.
QUERY_TIMEOUT = 5.0


def gpu_uuids(gpus: Sequence[str]) -> tuple[str, ...]:
    """The UUID of each of ``gpus`` (CUDA indices as Spark's discovery reports them), in order;
    empty when any cannot be read (no nvidia-smi, ids that are not indices, an error)."""
    if not gpus:
        return ()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=QUERY_TIMEOUT,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return uuids_for(gpus, out)


def uuids_for(gpus: Sequence[str], listing: str) -> tuple[str, ...]:
    """Pick ``gpus`` out of nvidia-smi's ``index, uuid`` lines."""
    by_index: dict[str, str] = {}
    for line in listing.splitlines():
        index, _, uuid = line.partition(",")
        if uuid.strip():
            by_index[index.strip()] = uuid.strip()
    found = tuple(by_index.get(str(g).strip(), "") for g in gpus)
    return found if all(found) else ()
