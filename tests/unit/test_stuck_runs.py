"""A stuck run says where it is stuck: real local runs (np=-2) with real worker processes.

Each run's error (or, for stall_action="warn", the log) must name every rank that was still
running with the line of this file it was at.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from sparktrain import (
    RunHungError,
    RunStalledError,
    RunTimeoutError,
    SparkRunner,
    WorkerFailedError,
)
from tests.helpers import interrupt_once_started, timed_out_while_running


def _reduce_or_sleep(started: str = "") -> float:
    import os
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(1)
    if started:  # this rank is about to block where the test expects to find it
        open(os.path.join(started, f"{dist.get_rank()}.started"), "w").close()
    if dist.get_rank() == 1:
        time.sleep(120)
    dist.all_reduce(tensor)
    return float(tensor.item())


def _silent_for(seconds: float, pid_dir: str = "") -> int:
    import os
    import time

    print("ready", flush=True)
    if pid_dir:
        with open(os.path.join(pid_dir, f"{os.environ['RANK']}.pid"), "w") as fh:
            fh.write(str(os.getpid()))
    time.sleep(seconds)
    print("done", flush=True)
    return int(os.environ["RANK"])


def _rank1_raises(folder: str) -> None:
    import os
    import time

    print("ready", flush=True)
    napping = os.path.join(folder, "rank0-napping")
    if os.environ["RANK"] == "1":
        deadline = time.monotonic() + 60
        while not os.path.exists(napping) and time.monotonic() < deadline:
            time.sleep(0.01)  # rank 0 is about to nap: its stack then shows where
        raise ValueError("rank 1 gave up")
    open(napping, "w").close()
    time.sleep(120)


def line_of(fn: Callable[..., object], text: str) -> str:
    """``test_stuck_runs.py:N``, N the line of ``fn`` that holds ``text``."""
    lines, first = inspect.getsourcelines(fn)
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"{os.path.basename(__file__)}:{first + offset}"


def where_line(message: str, rank: int) -> str:
    """The summary line of ``rank`` in an error's "Where each rank was" list."""
    prefix = f"  rank {rank}: "
    return next(line for line in message.splitlines() if line.startswith(prefix))


def test_a_timeout_names_each_rank_with_its_frame(tmp_path: Path) -> None:
    # Both ranks must have reached where they block when the timeout fires (a busy machine can
    # take longer than the first timeout to import torch): see timed_out_while_running.
    def attempt(folder: Path, timeout: float) -> RunTimeoutError:
        runner = SparkRunner(np=-2, timeout=timeout, grace_period=1, progress=False)
        with pytest.raises(
            RunTimeoutError, match=f"^the run exceeded timeout={timeout:g}s"
        ) as info:
            runner.run(_reduce_or_sleep, str(folder))
        return info.value

    error = timed_out_while_running(attempt, tmp_path, (8, 20, 40, 80), pattern="*.started")
    message = str(error)
    rank0, rank1 = where_line(message, 0), where_line(message, 1)
    assert rank0.startswith("  rank 0: in all_reduce (")
    assert line_of(_reduce_or_sleep, "dist.all_reduce(tensor)") in rank0
    assert "_reduce_or_sleep" in rank0
    assert rank1 == (
        f"  rank 1: in _reduce_or_sleep at {line_of(_reduce_or_sleep, 'time.sleep')}: "
        "time.sleep(120)"
    )
    # Then each rank's stack, most recent call last, and its output.
    assert "rank 0 on 127.0.0.1 was still running" in message
    assert "its main thread's stack (most recent call last):" in message
    assert re.search(r'distributed_c10d.py", line \d+, in all_reduce\n', message)
    assert set(error.stopped) == {0, 1}


def test_a_stall_with_stall_action_fail_ends_the_run_with_the_stacks() -> None:
    runner = SparkRunner(
        np=-2, stall_timeout=4, stall_action="fail", grace_period=1, progress=False
    )
    with pytest.raises(RunStalledError) as info:
        runner.run(_silent_for, 120)
    message = str(info.value)
    assert message.startswith("no rank has printed or reported anything for 4s")
    expected = f"in _silent_for at {line_of(_silent_for, 'time.sleep')}: time.sleep(seconds)"
    assert where_line(message, 0) == f"  rank 0: {expected}"
    assert where_line(message, 1) == f"  rank 1: {expected}"
    assert "  | ready" in message  # the last output lines come too


def test_a_stall_with_stall_action_warn_shows_the_stacks_once_and_the_run_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sparktrain")
    runner = SparkRunner(np=-2, stall_timeout=3, grace_period=1, progress=False)
    assert runner.run(_silent_for, 7) == 0
    expected = f"in _silent_for at {line_of(_silent_for, 'time.sleep')}: time.sleep(seconds)"
    shown = [r.getMessage() for r in caplog.records if expected in r.getMessage()]
    assert sorted(m.splitlines()[0] for m in shown) == [
        f"rank 0 on 127.0.0.1 is running: {expected}",
        f"rank 1 on 127.0.0.1 is running: {expected}",
    ]
    assert "no rank has printed or reported anything for 3s" in caplog.text


def test_a_failure_elsewhere_shows_where_the_stopped_rank_was(tmp_path: Path) -> None:
    runner = SparkRunner(np=-2, grace_period=1, progress=False)
    with pytest.raises(WorkerFailedError) as info:
        runner.run(_rank1_raises, str(tmp_path))
    message = str(info.value)
    assert info.value.root_cause.rank == 1
    assert message.index("rank 1 on 127.0.0.1 raised ValueError") < message.index("Where each")
    assert where_line(message, 0) == (
        f"  rank 0: in _rank1_raises at {line_of(_rank1_raises, 'time.sleep(120)')}: "
        "time.sleep(120)"
    )


def test_an_interrupt_shows_where_every_rank_was(tmp_path: Path) -> None:
    interrupt_once_started(tmp_path)
    runner = SparkRunner(np=-2, grace_period=1, progress=False)
    with pytest.raises(KeyboardInterrupt) as info:
        runner.run(_silent_for, 120, str(tmp_path))
    message = str(info.value)
    assert message.startswith("interrupted; every rank was stopped.")
    expected = f"in _silent_for at {line_of(_silent_for, 'time.sleep')}: time.sleep(seconds)"
    assert where_line(message, 0) == f"  rank 0: {expected}"
    assert where_line(message, 1) == f"  rank 1: {expected}"


# --- hangs in collectives (the hang watch, on by default) --------------------------------------


def _computes(seconds: float, behind: int = -1) -> float:
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == behind:
        time.sleep(3600)  # never joins the all_reduce below
    else:
        time.sleep(seconds)  # every rank works, outside any collective
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    return float(tensor.item())


def test_a_rank_that_never_joins_a_collective_is_named_and_the_run_ends() -> None:
    runner = SparkRunner(np=-2, stall_timeout=3, grace_period=1, progress=False)
    with pytest.raises(RunHungError) as info:
        runner.run(_computes, 0, 1)
    message = str(info.value)
    assert re.match(
        r"the run hung: rank 1 \(host 127\.0\.0\.1, pid \d+; outside any collective, 1 done\) "
        r"is behind, while rank 0 \(host 127\.0\.0\.1, pid \d+; waiting in collective #2\) "
        r"waited, and no rank moved for 3s \(stall_timeout, spark\.sparktrain\.stallTimeout\)",
        message,
    ), message
    rank0, rank1 = where_line(message, 0), where_line(message, 1)
    assert rank0.startswith("  rank 0: in all_reduce (")
    assert line_of(_computes, "dist.all_reduce(tensor)") in rank0
    assert rank1 == (
        f"  rank 1: in _computes at {line_of(_computes, 'time.sleep(3600)')}: "
        "time.sleep(3600)  # never joins the all_reduce below"
    )
    assert "its main thread's stack (most recent call last):" in message
    assert set(info.value.stopped) == {0, 1}


def test_a_long_computation_outside_collectives_is_not_a_hang() -> None:
    # Both ranks compute for longer than stall_timeout, outside any collective, then meet.
    runner = SparkRunner(np=-2, stall_timeout=2, grace_period=1, progress=False)
    assert runner.run(_computes, 3) == 2.0


def _ddp_step(behind: int) -> float:
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(2, 1))
    loss = model(torch.ones(4, 2)).sum()
    if dist.get_rank() == behind:
        time.sleep(3600)  # never reaches the gradients' all-reduce
    loss.backward()
    return float(loss.item())


def test_a_ddp_rank_that_never_reaches_backward_is_named_and_the_run_ends() -> None:
    runner = SparkRunner(np=-2, stall_timeout=3, grace_period=1, progress=False)
    with pytest.raises(RunHungError) as info:
        runner.run(_ddp_step, 1)
    message = str(info.value)
    assert message.startswith("the run hung: rank 1 (host 127.0.0.1, pid "), message
    assert "is behind, while rank 0 (host 127.0.0.1, pid " in message
    rank0 = where_line(message, 0)
    assert rank0.startswith("  rank 0: in _engine_run_backward (")
    assert rank0.endswith(
        f"called from _ddp_step at {line_of(_ddp_step, 'loss.backward()')}: loss.backward()"
    )
    assert where_line(message, 1) == (
        f"  rank 1: in _ddp_step at {line_of(_ddp_step, 'time.sleep(3600)')}: "
        "time.sleep(3600)  # never reaches the gradients' all-reduce"
    )


def _hvd_reduce(behind: int, pid_dir: str) -> float:
    import os
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    with open(os.path.join(pid_dir, f"{hvd.rank()}.pid"), "w") as fh:
        fh.write(str(os.getpid()))
    if hvd.rank() == behind:
        time.sleep(3600)  # never joins the allreduce below
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum)
    return float(total.item())


def _installed_horovod() -> bool:
    from sparktrain.backends import horovod_install

    return horovod_install.installed_horovod() is not None


@pytest.mark.parametrize(
    "impl",
    [
        "builtin",
        pytest.param(
            "horovod",
            marks=pytest.mark.skipif(not _installed_horovod(), reason="Horovod is not installed"),
        ),
    ],
)
def test_a_horovod_rank_that_never_joins_an_allreduce_is_named_and_the_run_ends(
    impl: str, tmp_path: Path
) -> None:
    from sparktrain import HorovodRunner

    runner = HorovodRunner(
        np=-2, stall_timeout=3, grace_period=1, progress=False, horovod_impl=impl
    )
    with pytest.raises(RunHungError) as info:
        runner.run(_hvd_reduce, 1, str(tmp_path))
    message = str(info.value)
    pid = {rank: (tmp_path / f"{rank}.pid").read_text() for rank in (0, 1)}
    assert re.match(
        rf"the run hung: rank 1 \(host 127\.0\.0\.1, pid {pid[1]}; outside any collective, "
        rf"\d+ done\) is behind, while rank 0 \(host 127\.0\.0\.1, pid {pid[0]}; waiting in "
        r"collective #\d+\) waited, and no rank moved for 3s \(stall_timeout, ",
        message,
    ), message
    rank0 = where_line(message, 0)
    # Horovod's own wait (mpi_ops.synchronize), or where the built-in one waits: the
    # torch.distributed all_gather that matches the ranks' requests.
    waits = {
        "horovod": "  rank 0: in synchronize (mpi_ops.py:",
        "builtin": "  rank 0: in all_gather (distributed_c10d.py:",
    }
    assert rank0.startswith(waits[impl]), rank0
    assert rank0.endswith(
        f"called from _hvd_reduce at {line_of(_hvd_reduce, 'hvd.allreduce(')}: "
        "total = hvd.allreduce(torch.ones(1), op=hvd.Sum)"
    )
    assert where_line(message, 1) == (
        f"  rank 1: in _hvd_reduce at {line_of(_hvd_reduce, 'time.sleep(3600)')}: "
        "time.sleep(3600)  # never joins the allreduce below"
    )
    assert "rank 1 on 127.0.0.1 was still running: in _hvd_reduce at " in message
    assert "its main thread's stack (most recent call last):" in message
    assert set(info.value.stopped) == {0, 1}
