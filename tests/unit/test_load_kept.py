"""``load_kept`` unpickles only a file no other account could have written, judged on the file
it actually opens: not one open to others, not one with a second name, not a FIFO (which must
not hang the call), and not a file reached through a folder swapped between check and open."""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import sparktrain
from sparktrain import private_dir
from sparktrain.errors import PayloadError
from sparktrain.shipping.payload import KEPT_RESULTS, keep_result


class _Runs:
    """Unpickling it creates ``marker``: the stand-in for someone else's code running."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (open, (str(self.marker), "w"))


def test_the_callers_own_file_open_to_others_is_refused(tmp: Path) -> None:
    marker = tmp / "code-ran"
    path = private_dir.folder(KEPT_RESULTS) / "open.pkl"
    path.write_bytes(pickle.dumps(_Runs(marker)))
    path.chmod(0o666)
    with pytest.raises(PayloadError, match=r"it is writable by others \(mode 0o666\)"):
        sparktrain.load_kept(path)
    path.chmod(0o620)
    with pytest.raises(PayloadError, match=r"it is writable by its group \(mode 0o620\)"):
        sparktrain.load_kept(path)
    assert not marker.exists()


def test_a_file_with_a_second_name_is_refused(tmp: Path) -> None:
    kept = keep_result(pickle.dumps("kept"), "linked")
    os.link(kept, tmp / "second-name")  # a name in a folder others can write
    with pytest.raises(PayloadError, match=r"a file with 2 names \(hard links\)"):
        sparktrain.load_kept(kept)
    (tmp / "second-name").unlink()
    assert sparktrain.load_kept(kept) == "kept"  # one name again: the caller's own, it loads


def test_a_fifo_in_the_files_place_is_refused_without_waiting(tmp: Path) -> None:
    fifo = private_dir.folder(KEPT_RESULTS) / "fifo.pkl"
    os.mkfifo(fifo, 0o600)
    outcome: queue.Queue[BaseException | object] = queue.Queue()

    def call() -> None:
        try:
            outcome.put(sparktrain.load_kept(fifo))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.put(exc)

    threading.Thread(target=call, daemon=True).start()
    try:
        got = outcome.get(timeout=30)
    except queue.Empty:
        # The call waits in open(2) for a writer: one comes and goes, to let it end.
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("load_kept waited for a writer to open the FIFO in the file's place")
    assert isinstance(got, PayloadError)
    assert "it is not a regular file (prw-------)" in str(got)


def test_a_folder_swapped_under_the_call_never_yields_a_file_from_another_folder(
    tmp: Path,
) -> None:
    # The path goes through a link that a racing thread points at the caller's results
    # folder, then at a folder anyone can write holding a file of the caller's own.
    good = private_dir.folder(KEPT_RESULTS)
    (good / "r.pkl").write_bytes(pickle.dumps("the kept result"))
    (good / "r.pkl").chmod(0o600)
    other = tmp / "anyones"
    other.mkdir()
    other.chmod(0o777)
    (other / "r.pkl").write_bytes(pickle.dumps("a file from another folder"))
    (other / "r.pkl").chmod(0o600)
    link = tmp / f"swap-{os.getpid()}"
    link.symlink_to(good)
    # Another process (no shared interpreter lock) swaps the link as fast as it can.
    swap = (
        "import os, sys\n"
        "link, staging = sys.argv[1], sys.argv[1] + '.new'\n"
        "print('swapping', flush=True)\n"
        "while True:\n"
        "    for target in sys.argv[2:]:\n"
        "        try:\n"
        "            os.unlink(staging)\n"
        "        except FileNotFoundError:\n"
        "            pass\n"
        "        os.symlink(target, staging)\n"
        "        os.replace(staging, link)\n"
    )
    swapper = subprocess.Popen(
        [sys.executable, "-c", swap, str(link), str(other), str(good)],
        stdout=subprocess.PIPE,
        text=True,
    )
    seen: dict[str, int] = {}
    calls = 0
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == "swapping\n"
        # At least 5,000 calls, and on until both folders have been seen (the race is real).
        while calls < 5000 or len(seen) < 2 and calls < 200_000:
            calls += 1
            try:
                value = sparktrain.load_kept(link / "r.pkl")
            except PayloadError as exc:
                assert f"its folder {link} can be written by" in str(exc)
                value = "refused"
            seen[value] = seen.get(value, 0) + 1
    finally:
        swapper.kill()
        swapper.wait(30)
    assert "a file from another folder" not in seen
    assert seen.get("the kept result", 0) > 0 and seen.get("refused", 0) > 0, seen
