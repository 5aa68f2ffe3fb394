"""Kill a saving process with SIGKILL at random instants; the newest commit must survive.

One helper interpreter imports torch once, then for each trial forks a child that saves
checkpoints in a loop (``keep_last=2``) and reports each step that ``save`` returned for
through a pipe. The helper SIGKILLs the child after a random delay and calls
``load_latest``: it must return a checkpoint whose content matches its step, and that step
must be the newest one reported, or the one after it (committed, then killed before the
report). A committed marker must never point at missing, truncated or corrupted data. The
same runs for sharded saves (``sharded=True``, one process, so a DCP folder per save), loaded
with ``load_latest(directory, into=state)``, and for asynchronous saves
(``asynchronous=True``, whole and sharded, written by a background thread): there a returned
``save`` reports the step before it, which it waited for, so the newest committed step may be
up to two ahead of the one reported (the next save's background write may commit before the
report).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
if not hasattr(os, "fork"):
    pytest.skip("the crash test forks", allow_module_level=True)

TRIALS = 200
SHARDED_TRIALS = 30  # sharded saves (save(..., sharded=True)) in one process: a DCP folder
ASYNC_TRIALS = 30  # asynchronous saves, whole and sharded: killed while a background thread
# writes, or not

HELPER = textwrap.dedent(
    """
    import json, os, random, signal, sys, time, warnings

    import torch

    torch.set_num_threads(1)  # forked children must not inherit a busy thread pool
    from sparktrain import checkpoint

    directory, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sharded = "sharded" in sys.argv[4]  # written through torch.distributed.checkpoint
    asynchronous = "async" in sys.argv[4]  # written by a background thread
    os.environ[checkpoint.RUN_ID_ENV] = "crash-test"  # every child is a restart of one run
    rng = random.Random(seed)

    def state(step):
        return {"step": step, "w": torch.full((64 * 1024,), float(step))}  # 256 KiB

    def saver(fd, first, where=directory):
        step = first
        while True:
            checkpoint.save(
                state(step), where, step, keep_last=2, sharded=sharded, asynchronous=asynchronous
            )
            if not asynchronous:
                os.write(fd, b"%d\\n" % step)
            elif step > first:  # this save waited for the one before: that one is committed
                os.write(fd, b"%d\\n" % (step - 1))
            step += 1

    def leftovers():
        names = os.listdir(directory) if os.path.isdir(directory) else []
        committed = {n.split(".")[0] for n in names if n.endswith(".commit.json")}
        return [n for n in names if n.endswith(".partial")
                or (n.endswith((".pt", ".dcp")) and n.split(".")[0] not in committed)]

    # imports, first use
    checkpoint.save(state(0), directory + "-warm", 0, sharded=sharded, asynchronous=asynchronous)
    started = time.perf_counter()
    for i in range(5):
        checkpoint.save(state(i), directory + "-calibrate", i, keep_last=1, sharded=sharded,
                        asynchronous=asynchronous)
    checkpoint.wait()  # no background write when forking
    per_save = (time.perf_counter() - started) / 5

    def first_save_after_fork():
        # A killed child is a fresh fork: its first save takes longer than the warm ones
        # above (copy-on-write, a busy machine), and the window must cover it.
        read_fd, write_fd = os.pipe()
        begun = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                saver(write_fd, 0, directory + "-calibrate-fork")
            finally:
                os._exit(1)
        os.close(write_fd)
        os.read(read_fd, 64)  # the first step reported
        took = time.perf_counter() - begun
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_fd)
        return took

    first_save = max(first_save_after_fork() for _ in range(3))
    # Kill instants over the first save of a fork and about 8 saves after it: a window
    # shorter than one save (a busy machine's saves of 100 ms against a cap of 0.1 s), or
    # than a fork's first save, leaves the kills after a save too rare.
    longest = min(max(first_save + 8 * per_save, 0.01), 0.5)

    reported = -1  # newest step known to be committed
    results = []
    for trial in range(trials):
        left_before = set(leftovers())
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                saver(write_fd, reported + 1)
            finally:
                os._exit(1)
        os.close(write_fd)
        time.sleep(rng.uniform(0, longest))  # the random instant of the crash
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read_fd, "rb") as pipe:
            steps = [int(line) for line in pipe.read().split()]
        before = reported
        if steps:
            reported = steps[-1]
        interrupted = bool(set(leftovers()) - left_before)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            into = state(-1) if sharded else None
            ckpt = checkpoint.load_latest(directory, into=into)
        got = None if ckpt is None else ckpt.step
        intact = ckpt is not None and ckpt.state["step"] == got and bool(
            torch.equal(ckpt.state["w"], state(got)["w"]))
        results.append({
            "trial": trial, "before": before, "reported": reported, "got": got,
            "intact": intact, "saves": len(steps), "interrupted": interrupted,
            "killed": os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL,
            "warnings": [str(w.message) for w in caught],
        })
        if got is not None:
            reported = max(reported, got)
    print(json.dumps({"per_save": per_save, "longest": longest, "results": results}))
    """
)


@pytest.mark.parametrize(
    ("kind", "trials"),
    [
        ("whole", TRIALS),
        ("sharded", SHARDED_TRIALS),
        ("async", ASYNC_TRIALS),
        ("sharded-async", ASYNC_TRIALS),
    ],
)
def test_sigkill_at_random_instants_never_loses_the_newest_commit(
    tmp_path: Path, kind: str, trials: int
) -> None:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RANK", None)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", HELPER, str(tmp_path / "ckpt"), str(trials), "20240611", kind],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=root,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    results = report["results"]
    assert len(results) == trials

    for r in results:
        assert r["killed"], r
        expected = {r["reported"], r["reported"] + 1}  # +1: committed, killed before reporting
        if "async" in kind:  # +2: the next save's background write committed before the report
            expected.add(r["reported"] + 2)
        if r["reported"] == -1:
            expected.add(None)  # nothing committed yet
        assert r["got"] in expected, r
        assert r["got"] is None or r["intact"], r
        damage = [w for w in r["warnings"] if "no commit marker" not in w]
        assert not damage, r  # a committed marker never points at bad data

    # The kills must land everywhere: mid-save, between saves, after several saves.
    mid_save = sum(r["interrupted"] for r in results)
    with_commits = sum(r["saves"] > 0 for r in results)
    unreported = sum(r["got"] is not None and r["got"] > r["reported"] for r in results)
    print(
        f"\n{trials} trials in {elapsed:.1f} s (one save ~{report['per_save'] * 1000:.1f} ms): "
        f"{mid_save} killed mid-save, {with_commits} after at least one save returned, "
        f"{unreported} between a commit and its report; newest step {results[-1]['got']}"
    )
    assert mid_save >= trials // 20
    assert with_commits >= trials // 20
    assert results[-1]["got"] is not None and results[-1]["got"] >= trials // 20
