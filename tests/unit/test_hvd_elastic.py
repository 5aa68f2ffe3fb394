"""``horovod.torch.elastic`` on the built-in Horovod API: Horovod's elastic scripts, run as
written through ``HorovodRunner(np=-2)`` on the driver with real failures (SIGKILL, SIGTERM,
a refused collective), and the ElasticSampler's place in an epoch across sizes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner
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


def _elastic_script(log_dir: str, stops: dict[int, tuple[str, int]]) -> list[int]:
    """A Horovod elastic script as Horovod's docs write it; it logs each step it takes, and in
    attempt ``a`` rank 1 gets signal ``stops[a][0]`` at step ``stops[a][1]``."""
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
    stop = stops.get(sparktrain.attempt())

    @hvd.elastic.run
    def train(state: Any) -> list[int]:
        while state.batch < STEPS:
            if stop and hvd.rank() == 1 and state.batch == stop[1]:
                os.kill(os.getpid(), getattr(signal, stop[0]))
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


def test_each_step_after_the_last_commit_runs_once_after_a_stop_and_a_kill(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    runner = _runner(-2, tmp_path / "commits", max_restarts=2, grace_period=60)
    stops = {0: ("SIGTERM", 3), 1: ("SIGKILL", 7)}
    done = runner.run(_elastic_script, str(logs), stops)
    assert done == list(range(STEPS))  # the committed history: each step once
    assert runner.last_run is not None
    causes = [str(a.cause) for a in runner.last_run.attempts]
    assert len(causes) == 3 and "SIGTERM" in causes[0] and "SIGKILL" in causes[1]
    # Attempt 1: rank 1 was asked to stop at step 3; both ranks went on to the commit after
    # it (batch 4) and ended there, so nothing is done again.
    assert _steps(logs, 0, 0) == _steps(logs, 0, 1) == [0, 1, 2, 3]
    # Attempt 2 resumed at step 4; rank 1 was killed at step 7, after the commit of step 5.
    assert _steps(logs, 1, 1) == [4, 5, 6]
    # Attempt 3 resumed at step 6, the first after the last commit, and did each once.
    assert _steps(logs, 2, 0) == _steps(logs, 2, 1) == [6, 7]


def _refused_then_trained() -> dict[str, Any]:
    """Every rank's allreduce is refused (mismatched shapes) once, after the second commit;
    then a function whose allreduce is always refused."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    model = torch.nn.Linear(2, 1)
    state = hvd.elastic.TorchState(model, batch=0, done=[])
    resets: list[int] = []
    refused: list[int] = []  # outside the state: a restore does not undo it
    state.register_reset_callbacks([lambda: resets.append(state.batch)])

    @hvd.elastic.run
    def train(state: Any) -> list[int]:
        while state.batch < 6:
            if state.batch == 4 and not refused:
                refused.append(state.batch)
                state.done.append(-1)  # undone by the restore
                with torch.no_grad():
                    model.weight.add_(100.0)  # likewise
                hvd.allreduce(torch.ones(1 + hvd.rank()), name="mismatched")
            state.done.append(state.batch)
            state.batch += 1
            if state.batch % 2 == 0:
                state.commit()
        return state.done

    @hvd.elastic.run
    def always_refused(state: Any) -> None:
        hvd.allreduce(torch.ones(1 + hvd.rank()), name="mismatched")

    done = train(state)
    try:
        always_refused(hvd.elastic.ObjectState(batch=0))
        gave_up = ""
    except hvd.HorovodInternalError as exc:
        gave_up = str(exc)
    from horovod.common.exceptions import HostsUpdatedInterrupt
    from horovod.torch.elastic import TorchState

    names = TorchState is hvd.elastic.TorchState and issubclass(HostsUpdatedInterrupt, RuntimeError)
    weight = model.weight.detach().abs().max().item()
    return {
        "names": names,
        "done": done,
        "resets": resets,
        "weights": hvd.allgather_object(weight),
        "gave_up": gave_up,
    }


def test_a_horovod_internal_error_restores_the_last_commit_in_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    runner = _runner(-2, None, max_restarts=0)
    result = runner.run(_refused_then_trained)
    assert result["names"]  # Horovod's module paths give the same objects
    assert result["done"] == list(range(6))  # the -1 after the commit was rolled back
    assert result["resets"] == [4]  # the callbacks ran once, after the restore
    assert all(w < 100 for w in result["weights"])  # the weights too, on every rank
    assert runner.last_run is not None and len(runner.last_run.attempts) == 1
    assert "HorovodInternalError 4 times with no commit between" in result["gave_up"]
    assert "giving up after 3 retries" in result["gave_up"]
    out = capsys.readouterr().out
    assert out.count("retry 1/3") == 2  # once per function, from rank 0
    # No commit folder: said once, naming the setting.
    assert out.count(f"Set {commits.COMMIT_DIR_ENV} in the ranks' environment") == 1


def _epoch_in_two_sizes(stop_after: int) -> dict[str, Any]:
    """Reads batches of an ElasticSampler's epoch, committing after each; returns what every
    rank read, the size, and when the reset callbacks ran."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    data = list(range(37))
    elastic_sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
    state = hvd.elastic.TorchState(sampler=elastic_sampler, epoch=0)
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

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
    return {"read": hvd.allgather_object(read), "resets": resets, "size": hvd.size()}


def test_an_epoch_resumes_at_another_size_and_the_callbacks_run(tmp_path: Path) -> None:
    where = tmp_path / "commits"
    first = _runner(-2, where).run(_epoch_in_two_sizes, stop_after=2)
    second = _runner(-1, where).run(_epoch_in_two_sizes, stop_after=-1)
    assert (first["size"], first["resets"]) == (2, [])
    assert (second["size"], second["resets"]) == (1, [1])  # committed by 2 ranks, now 1
    before, after = sum(first["read"], []), sum(second["read"], [])
    assert len(before) == 2 * 2 * 3  # two batches of 3 on each of 2 ranks
    assert sorted(before + after) == list(range(37))  # the rest, each row once


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


def test_a_commit_is_read_back_and_a_folder_of_other_checkpoints_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from sparktrain import checkpoint

    monkeypatch.setattr(commits, "rank", lambda: 0)  # rank 0 of a job of 3
    monkeypatch.setattr(commits, "size", lambda: 3)
    kept = commits.Commits(str(tmp_path / "commits"))
    assert kept.newest() is None
    kept.write({"objects": {"epoch": 2}, "handlers": {"model": {"w": torch.ones(2)}}})
    kept.write({"objects": {"epoch": 3}, "handlers": {"model": {"w": torch.zeros(2)}}})
    newest = commits.Commits(str(tmp_path / "commits")).newest()
    assert newest is not None
    assert (newest["step"], newest["world_size"], newest["objects"]) == (1, 3, {"epoch": 3})
    assert newest["handlers"]["model"]["w"].tolist() == [0.0, 0.0]
    checkpoint.save({"model": {}}, tmp_path / "other", 7)
    with pytest.raises(ConfigurationError, match="must name a folder of its own"):
        commits.Commits(str(tmp_path / "other")).newest()


def test_a_commit_refuses_what_it_could_not_load_back() -> None:
    class Opaque:
        pass

    commits.check_keepable({"epoch": 3, "lr": [0.1, None], "t": __import__("torch").ones(1)}, "s")
    with pytest.raises(ConfigurationError, match=r"state.extra\['x'\] holds a Opaque"):
        commits.check_keepable({"x": Opaque()}, "state.extra")
