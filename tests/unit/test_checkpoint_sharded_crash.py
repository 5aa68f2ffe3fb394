"""Kill one rank of two with SIGKILL at random instants of sharded saves; the newest commit
must survive, whole.

One helper interpreter imports torch once, then for each trial forks two ranks that join a
gloo process group (a fresh ``FileStore`` per trial) and save sharded checkpoints in a loop
(``sharded=True, keep_last=2``, with the loader's state), each rank reporting through a pipe
every step its ``save`` returned for. Each rank writes a tensor of its own, so both ranks'
shards are in every checkpoint. The helper SIGKILLs one rank, chosen at random, after a
random delay, then the other a random moment later (it may still commit, fail on its
own as its peer vanished, or hang in a collective), and loads the directory in one process (``load_latest(directory, into=state)``):
the checkpoint must be the newest step reported, or the one after it (committed, then killed
before the report); both ranks' tensors and the loader's state must be those of that step;
and no committed marker may point at missing, truncated or corrupted files.

The same runs with asynchronous saves (``asynchronous=True``): each rank waits for the save
before (``checkpoint.wait()``), reports its step as committed, starts the next save and at once
overwrites the tensors it saved, as training would; so the kill also lands during background
writes and staging, and a checkpoint holding anything but the staged values is caught.
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

TRIALS = 30
ROWS = 100_000  # the sampler's rows: each step consumes one row on each rank

HELPER = textwrap.dedent(
    """
    import datetime, json, os, random, signal, sys, time, warnings

    import torch

    torch.set_num_threads(1)  # forked children must not inherit a busy thread pool
    import torch.distributed as dist
    from sparktrain import checkpoint
    from sparktrain.data import ResumableDistributedSampler

    directory, trials, seed, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    asynchronous = sys.argv[5] == "asynchronous"
    os.environ[checkpoint.RUN_ID_ENV] = "sharded-crash-test"  # every pair restarts one run
    rng = random.Random(seed)

    def state(step, rank=None):
        ranks = (0, 1) if rank is None else (rank,)
        tensors = {f"w{r}": torch.full((32 * 1024,), float(step * 10 + r)) for r in ranks}
        return {"step": step, **tensors}  # 128 KiB per rank

    def rank_main(rank, fd, first, where, store_path):
        os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
        store = dist.FileStore(store_path, 2)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60))
        sampler = ResumableDistributedSampler(rows, num_replicas=2, rank=rank, shuffle=False)
        next(iter(sampler))  # an epoch in progress: its place is the rows consumed
        step = first
        while True:
            if asynchronous:
                checkpoint.wait()  # the save before is committed: it is reported
                if step > first:
                    os.write(fd, b"%d %d %.6f\\n" % (rank, step - 1, time.perf_counter()))
            live = state(step, rank)
            checkpoint.save(live, where, step, keep_last=2, sharded=True,
                            loader=sampler.state_dict(consumed=step), asynchronous=asynchronous)
            if asynchronous:  # training changes the tensors while the staged copy is written
                for tensor in live.values():
                    if isinstance(tensor, torch.Tensor):
                        tensor.fill_(-1.0)
            else:
                os.write(fd, b"%d %d %.6f\\n" % (rank, step, time.perf_counter()))
            step += 1

    counter = [0]

    def start_pair(first, where):
        counter[0] += 1
        store_path = os.path.join(os.path.dirname(directory), "store-%d" % counter[0])
        read_fd, write_fd = os.pipe()
        pids = []
        for rank in (0, 1):
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                try:
                    rank_main(rank, write_fd, first, where, store_path)
                finally:
                    os._exit(1)
            pids.append(pid)
        os.close(write_fd)
        return pids, read_fd

    def stop(pids, read_fd):
        statuses = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            statuses.append(os.waitpid(pid, 0)[1])
        with os.fdopen(read_fd, "rb") as pipe:
            lines = [line.split() for line in pipe.read().splitlines()]
        return statuses, [(int(r), int(s), float(t)) for r, s, t in lines]

    # Imports and first uses (DCP, the loader's state) here, once, not in every fork.
    warm = ResumableDistributedSampler(rows, num_replicas=1, rank=0, shuffle=False)
    next(iter(warm))
    checkpoint.save(state(0), directory + "-warm", 0, sharded=True, loader=warm)
    checkpoint.load_latest(directory + "-warm", into={**state(0), "loader": None})
    if asynchronous:  # staging and the background thread, once
        checkpoint.save(state(1), directory + "-warm", 1, sharded=True, asynchronous=True)
        checkpoint.wait()

    # Calibrate on a pair of its own: a fork's first save, and the warm saves after it.
    begun = time.perf_counter()
    pids, read_fd = start_pair(0, directory + "-calibrate")
    buffer = b""
    while buffer.count(b"\\n") < 12:  # 6 steps of both ranks
        buffer += os.read(read_fd, 4096)
    reports = [(int(r), int(s), float(t)) for r, s, t in
               (line.split() for line in buffer.splitlines()[:12])]
    stop(pids, read_fd)
    done = sorted(t for _, _, t in reports)
    first_save = done[1] - begun
    per_save = (done[-1] - done[1]) / 5
    longest = min(max(first_save + 8 * per_save, 0.02), 1.5)

    def leftovers():
        names = os.listdir(directory) if os.path.isdir(directory) else []
        committed = {n.split(".")[0] for n in names if n.endswith(".commit.json")}
        return [n for n in names if n.endswith(".dcp") and n.split(".")[0] not in committed]

    reported = -1  # newest step known to be committed
    results = []
    for trial in range(trials):
        left_before = set(leftovers())
        pids, read_fd = start_pair(reported + 1, directory)
        victim = rng.randrange(2)
        time.sleep(rng.uniform(0, longest))  # the random instant of the crash
        os.kill(pids[victim], signal.SIGKILL)
        time.sleep(rng.uniform(0, per_save))  # the other rank may still get somewhere
        statuses, lines = stop(pids, read_fd)
        before = reported
        steps = [s for _, s, _ in lines]
        if steps:
            reported = max(steps)
        interrupted = bool(set(leftovers()) - left_before)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            into = state(-1)
            ckpt = checkpoint.load_latest(directory, into=into)
        got = None if ckpt is None else ckpt.step
        intact = loader_ok = False
        if ckpt is not None:
            intact = into["step"] == got and all(
                torch.equal(into[k], v) for k, v in state(got).items() if k != "step")
            sampler = ResumableDistributedSampler(rows, num_replicas=1, rank=0, shuffle=False)
            sampler.load_state_dict(into["loader"])
            loader_ok = len(sampler) == rows - 2 * got  # each rank had consumed `got` rows
        results.append({
            "trial": trial, "victim": victim, "before": before, "reported": reported,
            "got": got, "intact": intact, "loader_ok": loader_ok, "saves": len(steps),
            "interrupted": interrupted,
            # the victim died of SIGKILL; the other rank too, or it failed on its own
            "killed": os.WIFSIGNALED(statuses[victim])
                      and os.WTERMSIG(statuses[victim]) == signal.SIGKILL,
            "warnings": [str(w.message) for w in caught],
        })
        if got is not None:
            reported = max(reported, got)
    print(json.dumps({"first_save": first_save, "per_save": per_save, "longest": longest,
                      "results": results}))
    """
)


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
def test_sigkill_of_one_rank_at_random_instants_of_sharded_saves_never_tears_a_checkpoint(
    tmp_path: Path, mode: str
) -> None:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", HELPER, str(tmp_path / "ckpt"), str(TRIALS), "20261207"]
        + [str(ROWS), mode],
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
    assert len(results) == TRIALS

    for r in results:
        assert r["killed"], r  # the victim, of SIGKILL
        expected = {r["reported"], r["reported"] + 1}  # +1: committed, killed before reporting
        if r["reported"] == -1:
            expected.add(None)  # nothing committed yet
        assert r["got"] in expected, r
        assert r["got"] is None or (r["intact"] and r["loader_ok"]), r
        damage = [w for w in r["warnings"] if "no commit marker" not in w]
        assert not damage, r  # a committed marker never points at bad files

    mid_save = sum(r["interrupted"] for r in results)
    with_commits = sum(r["saves"] > 0 for r in results)
    print(
        f"\n{mode}: {TRIALS} trials in {elapsed:.1f} s (a fork pair's first save "
        f"~{report['first_save'] * 1000:.0f} ms, then ~{report['per_save'] * 1000:.1f} ms "
        f"each): {mid_save} killed mid-save, {with_commits} after at least one save returned; "
        f"victims {sum(r['victim'] for r in results)} of rank 1; "
        f"newest step {results[-1]['got']}"
    )
    # The kills must land everywhere: mid-save and after saves, both ranks among the victims.
    assert mid_save >= 3 and with_commits >= 3
    assert 0 < sum(r["victim"] for r in results) < TRIALS
    assert results[-1]["got"] is not None and results[-1]["got"] >= 3
