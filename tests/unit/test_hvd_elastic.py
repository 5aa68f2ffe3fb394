"""``horovod.torch.elastic`` on the built-in Horovod API: Horovod's elastic scripts, run as
written through ``HorovodRunner(np=-2)`` on the driver with real failures (SIGKILL, SIGTERM,
a refused collective), and the ElasticSampler's place in an epoch across sizes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner, WorkerFailedError
from sparktrain.errors import ConfigurationError
from sparktrain.hvdcompat.elastic import commits, sampler
from sparktrain.hvdcompat.elastic.sampler import ElasticSampler

STEPS = 8


def _runner(np: int, commit_dir: Path | None, **settings: Any) -> SparkRunner:
    env = {} if commit_dir is None else {commits.COMMIT_DIR_ENV: str(commit_dir)}
    return SparkRunner(
        np=np,
        backend="horovod",
        horovod_impl="builtin",
        progress=False,
        env=env,
        **settings,
    )


def _elastic_script(log_dir: str, kill: str = "", kill_at: int = -1) -> list[int]:
    """A Horovod elastic script as Horovod's docs write it; it logs each step it takes, and
    on the first attempt rank 1 is ``kill``ed at step ``kill_at``."""
    import os
    import signal

    import horovod.torch as hvd
    import torch

    import sparktrain

    hvd.init()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    log = open(os.path.join(log_dir, f"a{sparktrain.attempt()}-r{hvd.rank()}"), "a")

    @hvd.elastic.run
    def train(state: Any) -> list[int]:
        while state.batch < STEPS:
            if kill and sparktrain.attempt() == 0 and hvd.rank() == 1 and state.batch == kill_at:
                os.kill(os.getpid(), getattr(signal, kill))
            optimizer.zero_grad()
            model(torch.ones(4, 2)).sum().backward()
            optimizer.step()
            log.write(f"{state.batch}\n")
            log.flush()
            state.done.append(state.batch)
            state.batch += 1
            if state.batch % 2 == 0:
                state.commit()
        return state.done

    state = hvd.elastic.TorchState(model, optimizer, batch=0, done=[])
    return train(state)


def _steps(log_dir: Path, attempt: int, rank: int) -> list[int]:
    path = log_dir / f"a{attempt}-r{rank}"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_a_sigkilled_rank_resumes_from_the_last_commit(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    runner = _runner(-2, tmp_path / "commits", max_restarts=1)
    done = runner.run(_elastic_script, str(logs), kill="SIGKILL", kill_at=5)
    assert done == list(range(STEPS))  # the committed history: each step once
    assert runner.last_run is not None and len(runner.last_run.attempts) == 2
    assert "SIGKILL" in str(runner.last_run.attempts[0].cause)
    # Attempt 1 took steps 0..4 (commits after 1 and 3); rank 1 died before step 5, so the
    # second attempt starts at step 4, the first after the last commit, and does each once.
    assert _steps(logs, 0, 1) == [0, 1, 2, 3, 4]
    for rank in (0, 1):
        assert _steps(logs, 1, rank) == list(range(4, STEPS))


def test_a_stop_request_ends_the_attempt_after_the_commit(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    runner = _runner(-2, tmp_path / "commits", max_restarts=1, grace_period=60)
    done = runner.run(_elastic_script, str(logs), kill="SIGTERM", kill_at=3)
    assert done == list(range(STEPS))
    assert runner.last_run is not None and len(runner.last_run.attempts) == 2
    assert "SIGTERM" in str(runner.last_run.attempts[0].cause)
    # Rank 1 got SIGTERM at step 3: both ranks went on to the commit after it (batch 4),
    # then ended; nothing is done twice.
    assert _steps(logs, 0, 0) == _steps(logs, 0, 1) == [0, 1, 2, 3]
    assert _steps(logs, 1, 0) == _steps(logs, 1, 1) == list(range(4, STEPS))


def test_without_a_commit_folder_commits_last_as_long_as_the_process(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    runner = _runner(-2, None, max_restarts=1, driver_log_verbosity="log_callback_only")
    done = runner.run(_elastic_script, str(logs), kill="SIGKILL", kill_at=5)
    assert done == list(range(STEPS))
    assert _steps(logs, 1, 0) == list(range(STEPS))  # nothing kept: from the beginning


def _refused_then_trained(log_dir: str) -> dict[str, Any]:
    """Every rank's allreduce is refused (mismatched shapes) once, after the second commit."""
    import os

    import horovod.torch as hvd
    import torch

    hvd.init()
    model = torch.nn.Linear(2, 1)
    state = hvd.elastic.TorchState(model, batch=0, done=[], refused=False, resets=0)
    state.register_reset_callbacks([lambda: setattr(state, "resets", state.resets + 1)])

    @hvd.elastic.run
    def train(state: Any) -> dict[str, Any]:
        while state.batch < 6:
            if state.batch == 4 and not os.path.exists(os.path.join(log_dir, "refused")):
                state.done.append(-1)  # undone by the restore
                with torch.no_grad():
                    model.weight.add_(100.0)  # likewise
                if hvd.rank() == 0:
                    open(os.path.join(log_dir, "refused"), "w").close()
                hvd.barrier()
                hvd.allreduce(torch.ones(1 + hvd.rank()), name="mismatched")
            state.done.append(state.batch)
            state.batch += 1
            if state.batch % 2 == 0:
                state.commit()
        weights = hvd.allgather_object(model.weight.detach().abs().max().item())
        return {"done": state.done, "resets": state.resets, "weights": weights}

    return train(state)


def test_a_horovod_internal_error_restores_the_last_commit_in_process(tmp_path: Path) -> None:
    runner = _runner(-2, None, max_restarts=0)
    result = runner.run(_refused_then_trained, str(tmp_path))
    assert result["done"] == list(range(6))  # the -1 after the commit was rolled back
    assert result["resets"] == 1  # the callbacks ran once, after the retry
    assert all(w < 100 for w in result["weights"])  # the weights too, on every rank
    assert runner.last_run is not None and len(runner.last_run.attempts) == 1


def _always_refused() -> None:
    import horovod.torch as hvd
    import torch

    hvd.init()

    @hvd.elastic.run
    def train(state: Any) -> None:
        hvd.allreduce(torch.ones(1 + hvd.rank()), name="mismatched")

    train(hvd.elastic.ObjectState(batch=0))


def test_retries_are_bounded() -> None:
    with pytest.raises(WorkerFailedError) as info:
        _runner(-2, None).run(_always_refused)
    assert "HorovodInternalError 4 times with no commit between" in str(info.value)


def _epoch_in_two_sizes(commit_dir_unused: str, stop_after: int) -> dict[str, Any]:
    """Reads batches of an ElasticSampler's epoch; commits after each; returns what it read
    (every rank's), the size, and how often the reset callbacks ran."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    data = list(range(37))
    elastic_sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
    state = hvd.elastic.TorchState(sampler=elastic_sampler, epoch=0, resets=0)
    state.register_reset_callbacks([lambda: setattr(state, "resets", state.resets + 1)])

    @hvd.elastic.run
    def train(state: Any) -> list[int]:
        loader = torch.utils.data.DataLoader(data, batch_size=3, sampler=state.sampler)
        read: list[int] = []
        for i, batch in enumerate(loader):
            if i == stop_after:
                break
            read += batch.tolist()
            state.sampler.record_batch(i, 3)
            state.commit()
        return read

    read = train(state)
    return {"read": hvd.allgather_object(read), "resets": state.resets, "size": hvd.size()}


def test_an_epoch_resumes_at_another_size_and_the_callbacks_run(tmp_path: Path) -> None:
    where = tmp_path / "commits"
    first = _runner(-3, where).run(_epoch_in_two_sizes, "", stop_after=2)
    second = _runner(-2, where).run(_epoch_in_two_sizes, "", stop_after=-1)
    assert (first["size"], first["resets"]) == (3, 0)
    assert (second["size"], second["resets"]) == (2, 1)  # committed by 3 ranks, now 2
    before = sum(first["read"], [])
    after = sum(second["read"], [])
    assert len(before) == 2 * 3 * 3
    assert sorted(set(before + after)) == list(range(37))
    assert len(before) + len(after) == 37 + (37 - 18) % 2  # padding: one row read twice


# -- the sampler alone ---------------------------------------------------------------------------


def _samplers(
    monkeypatch: pytest.MonkeyPatch, n: int, dataset: list[int], saved: Any = None
) -> list[Any]:
    """One ElasticSampler per rank of ``n``, as each rank's process would make it (and load
    ``saved`` into)."""
    made = []
    for r in range(n):
        monkeypatch.setattr(sampler, "rank", lambda r=r: r)
        monkeypatch.setattr(sampler, "size", lambda n=n: n)
        made.append(ElasticSampler(dataset, shuffle=True, seed=7))
        if saved is not None:
            made[-1].load_state_dict(saved)
    return made


@pytest.mark.parametrize("before", [1, 2, 3, 4])
@pytest.mark.parametrize("after", [1, 2, 3, 4])
def test_the_sampler_reads_every_index_once_across_a_resize(
    monkeypatch: pytest.MonkeyPatch, before: int, after: int
) -> None:
    dataset, batch = list(range(29)), 2
    ranks = _samplers(monkeypatch, before, dataset)
    read: list[int] = []
    shares = [list(s) for s in ranks]
    for i in range(2):  # two batches on every rank, then the run stops
        for s, share in zip(ranks, shares, strict=True):
            read += share[i * batch : (i + 1) * batch]
            s.record_batch(i, batch)
    saved = ranks[0].state_dict()
    assert all(s.state_dict() == saved for s in ranks)  # the same place on every rank
    resumed = _samplers(monkeypatch, after, dataset, saved)
    for s in resumed:
        read += list(s)
    left = 29 - 2 * batch * before
    assert sorted(set(read)) == dataset
    assert len(read) == 29 + (-left) % after  # only the last round's padding repeats
    assert len(resumed[0]) == math.ceil(left / after)


def test_the_sampler_starts_the_next_epoch_whole_in_a_new_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (one,) = _samplers(monkeypatch, 1, list(range(10)))
    first = list(one)
    one.record_batch(0, 4)
    one.record_indices([first[5]])
    assert list(one.__iter__()) == first  # the place changes only at a reset
    one.reset()
    assert list(one) == first[4:5] + first[6:]
    one.set_epoch(1)
    second = list(one)
    assert sorted(second) == list(range(10)) and second != first


def test_a_commit_refuses_what_it_could_not_load_back() -> None:
    class Opaque:
        pass

    commits.check_keepable({"epoch": 3, "lr": [0.1, None], "t": __import__("torch").ones(1)}, "s")
    with pytest.raises(ConfigurationError, match=r"state.extra\['x'\] holds a Opaque"):
        commits.check_keepable({"x": Opaque()}, "state.extra")
