"""sparktrain's built-in horovod.torch (``horovod_impl``) against the installed Horovod: the
same Horovod-API functions on both, compared, on the driver (np<0) and on local-cluster
executors (np>0); and the tutorials' code on a driver where Horovod cannot be imported."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner, WorkerFailedError
from sparktrain.backends.horovod_install import horovod_torch_library
from tests.conftest import ROOT, ranks
from tests.fixtures import hvd_compat, hvd_trainers

needs_horovod = pytest.mark.skipif(
    horovod_torch_library() is None,
    reason="horovod.torch is not importable: build it with scripts/install-horovod.sh",
)
BUILTIN_LINE = "sparktrain: horovod.torch here is sparktrain's built-in implementation"

_runs: dict[tuple[Any, ...], dict[str, Any]] = {}


def _runner(np: int, impl: str) -> SparkRunner:
    """HorovodRunner's runner, with the given horovod.torch implementation."""
    return SparkRunner(np=np, backend="horovod", horovod_impl=impl)


def _run(mode: str, impl: str, **kwargs: Any) -> dict[str, Any]:
    """``parity_steps`` under one implementation; each combination runs once per session."""
    key = (mode, impl, tuple(sorted(kwargs.items())))
    if key not in _runs:
        result: dict[str, Any] = _runner(ranks(mode, 2), impl).run(
            hvd_compat.parity_steps, **kwargs
        )
        assert result["builtin"] is (impl == "builtin")  # the implementation asked for ran
        _runs[key] = result
    return _runs[key]


def _flat(result: dict[str, Any]) -> list[float]:
    views = result["ranks"]
    assert [v["rank"] for v in views] == [0, 1]
    # Every rank holds the same replica (rank 0's start, averaged gradients).
    assert views[0]["params"] == pytest.approx(views[1]["params"], abs=1e-6)
    return list(views[0]["params"])


@pytest.mark.parametrize(
    ("optimizer_name", "fp16", "tolerance"),
    [("sgd", False, 1e-5), ("adam", False, 1e-5), ("sgd", True, 2e-3)],
    ids=["sgd", "adam", "sgd-fp16"],
)
@pytest.mark.horovod
@needs_horovod
def test_same_parameters_as_horovod(
    mode: str, optimizer_name: str, fp16: bool, tolerance: float
) -> None:
    kwargs = {"optimizer_name": optimizer_name, "fp16": fp16}
    if mode == "spark" and (optimizer_name, fp16) != ("sgd", False):
        pytest.skip("on executors, one comparison is enough (each run takes a Spark job)")
    theirs = _run(mode, "horovod", **kwargs)
    ours = _run(mode, "builtin", **kwargs)
    assert ours["isinstance"] and theirs["isinstance"]  # the wrapper is the optimizer's class
    assert _flat(ours) == pytest.approx(_flat(theirs), rel=tolerance, abs=tolerance)
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=tolerance)
    for view_ours, view_theirs in zip(ours["ranks"], theirs["ranks"], strict=True):
        assert view_ours["metric"] == view_theirs["metric"] == 1.5  # metric_average
        assert view_ours["lr"] == view_theirs["lr"]  # rank 0's, by broadcast_optimizer_state


@pytest.mark.horovod
@needs_horovod
def test_workshop_steps_as_horovod() -> None:
    # Optimizer state broadcast before wrapping, fp16 compression, allgather_object.
    results = {
        impl: _runner(-2, impl).run(hvd_trainers.workshop_steps) for impl in ("horovod", "builtin")
    }
    ours, theirs = results["builtin"], results["horovod"]
    assert ours["compression"] == theirs["compression"] == "FP16Compressor"
    for mine, real in zip(ours["ranks"], theirs["ranks"], strict=True):
        assert mine["avg"] == real["avg"] == 1.5
        assert mine["lr"] == real["lr"] == 0.01
        assert mine["momentum"] == pytest.approx(real["momentum"], rel=1e-6)
        assert mine["params"] == pytest.approx(real["params"], rel=2e-3, abs=2e-3)


@pytest.mark.parametrize(
    ("what", "expected"),
    [
        ("mpi_lib_v2", "hvd.mpi_lib_v2 is not supported by sparktrain's built-in horovod.torch"),
        ("adasum", "op=hvd.Adasum is not supported by sparktrain's built-in horovod.torch; use"),
    ],
    ids=["mpi_lib_v2", "adasum"],
)
def test_unsupported_parts_fail_naming_themselves(mode: str, what: str, expected: str) -> None:
    if mode == "spark" and what == "adasum":
        pytest.skip("on executors, one failure is enough (each run takes a Spark job)")
    with pytest.raises(WorkerFailedError) as info:
        _runner(ranks(mode, 2), "builtin").run(hvd_compat.unsupported, what)
    assert expected in str(info.value)
    assert "NotImplementedError" in str(info.value)


def test_builtin_setting_shadows_horovod_on_the_ranks_only(
    capfd: pytest.CaptureFixture[str],
) -> None:
    result = _runner(-2, "builtin").run(hvd_compat.parity_steps, steps=1)
    assert result["builtin"] is True
    out = capfd.readouterr()
    line = f"{BUILTIN_LINE} on torch.distributed (chosen by horovod_impl='builtin'"
    assert line in out.out + out.err
    # The driver's own import of horovod is untouched.
    assert "horovod" not in sys.modules or "sparktrain" not in str(sys.modules["horovod"].__file__)
    spec = importlib.util.find_spec("horovod")
    if spec is not None:
        assert "hvdcompat" not in str(spec.origin)


# A driver process that cannot import the installed Horovod, and whose ranks cannot either:
# as on a machine where Horovod was never installed.
HIDE_HOROVOD = """
import importlib.abc, importlib.machinery, sys, sysconfig

_SITE = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}


class _HideInstalledHorovod(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "horovod":
            return None
        elsewhere = [p for p in sys.path if p not in _SITE]
        spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        if spec is None:
            raise ModuleNotFoundError("No module named 'horovod'", name=name)
        return spec


sys.meta_path.insert(0, _HideInstalledHorovod())
"""

DRIVER = """
import importlib, json, sys
try:
    import horovod
    print("DRIVER-HOROVOD " + str(horovod.__file__))
except ImportError as exc:
    print("DRIVER-HOROVOD none: " + str(exc))
from sparktrain import HorovodRunner
from tests.fixtures import hvd_trainers
result = HorovodRunner(np=-2).run(  # its default verbosity shows no rank output
    hvd_trainers.train_hvd, learning_rate=0.1, num_epochs=3, checkpoint_dir=sys.argv[1]
)
print("RESULT " + json.dumps(result))
"""


def test_tutorial_runs_unchanged_without_horovod(tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(textwrap.dedent(HIDE_HOROVOD))
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(hide), str(ROOT)])
    env.pop("SPARKTRAIN_HOROVOD_IMPL", None)
    assert sysconfig.get_paths()["purelib"] in sys.path  # the hook hides site-packages' copy
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(checkpoints)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "DRIVER-HOROVOD none: No module named 'horovod'" in out  # nothing shadowed there
    # Said once, on the driver, although HorovodRunner's default verbosity hides rank output.
    notice = f"{BUILTIN_LINE} on torch.distributed (Horovod is not installed)"
    assert [line for line in out.splitlines() if BUILTIN_LINE in line] == [f"[rank 0] {notice}"]
    result = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])
    assert result["rank"] == 0 and result["size"] == 2
    assert result["losses"][-1] < result["losses"][0] * 0.8, result["losses"]
    import torch

    saved = sorted(checkpoints.glob("checkpoint-*.pth.tar"))
    assert [p.name for p in saved] == [f"checkpoint-{e}.pth.tar" for e in (1, 2, 3)]
    assert {torch.load(p, weights_only=False)["rank"] for p in saved} == {0}


@pytest.mark.horovod
@needs_horovod
def test_collectives_as_horovod() -> None:
    ours = _runner(-2, "builtin").run(hvd_compat.collectives)
    theirs = _runner(-2, "horovod").run(hvd_compat.collectives)
    assert ours["fp16"] == pytest.approx(theirs.pop("fp16"), rel=1e-3)
    ours.pop("fp16")
    # Which rank joins last is a race in both: only its range is certain.
    assert ours.pop("join") in (0, 1) and theirs.pop("join") in (0, 1)
    assert ours == theirs
    assert ours["scaled"] == [2.25, 22.5, -2.25]  # (x0 + x1) * 0.5 * 3.0 / 2, by hand


@pytest.mark.horovod
@needs_horovod
def test_accumulation_clipping_and_unused_parameters_as_horovod() -> None:
    ours = _runner(-2, "builtin").run(hvd_compat.accumulate_and_clip)
    theirs = _runner(-2, "horovod").run(hvd_compat.accumulate_and_clip)
    assert ours["params"][0] == pytest.approx(ours["params"][1], abs=1e-7)  # one replica
    assert ours["params"][0] == pytest.approx(theirs["params"][0], rel=1e-5, abs=1e-6)
    assert ours["norms"] == pytest.approx(theirs["norms"], rel=1e-5)


def test_too_many_backward_passes_fail_naming_the_setting() -> None:
    with pytest.raises(WorkerFailedError) as info:
        _runner(-2, "builtin").run(hvd_compat.too_many_backward_passes)
    assert "gradients were computed more than backward_passes_per_step=1 times" in str(info.value)
    assert "raise backward_passes_per_step in hvd.DistributedOptimizer" in str(info.value)


# Horovod's values by hand: averages and scale factors multiply in float64 and truncate toward
# zero (-73 / 2 = -36.5 gives -36); int16/uint8 sums wrap; a bool sum is a logical or.
EXACT = {
    2: {
        "int32_average": [-36, 2, 3, 0, 50],
        "int_prescale": [-6, 2, 4],
        "int_inplace_scaled": [-3, 1, 2],
        "int16_sum": [True, [-5536, -4]],  # 60000 wraps
        "int16_min_max_product": [[0, -1, 6], [1, 0, 7], [0, 0, 42]],
        "uint8_sum": [144, 2],
        "int16_allgather": ["torch.int16", [[-1000, -1000], [-1001, -1001], [-1001, -1001]]],
        "allgather_async": [0, 1, 10, 11],
        "after_errors": [1.0],
        "held": [3.0],
        "reused": [4.0],
    },
    3: {
        "int32_average": [-24, 1, 2, 0, 33],
        "int_prescale": [-9, 3, 6],
        "int_inplace_scaled": [-4, 1, 3],
        "int16_sum": [True, [24464, -6]],  # 90000 wraps
        "int16_min_max_product": [[0, -2, 5], [2, 0, 7], [0, 0, 210]],
        "uint8_sum": [88, 3],
        "int16_allgather": [
            "torch.int16",
            [[-1000, -1000], [-1001, -1001], [-1001, -1001]] + [[-1002, -1002]] * 3,
        ],
        "allgather_async": [0, 1, 10, 11, 20, 21],
        "after_errors": [3.0],
        "held": [6.0],
        "reused": [6.0],
    },
}
MISMATCHES = {
    "allreduce_dtype": "hvd.allreduce: the ranks passed tensors of different data types: "
    "rank 0 int32, rank 1 float32. Every rank must pass the same; nothing was sent",
    "allreduce_shape": "tensors of different shapes: rank 0 [17, 17, 17], rank 1 [18, 18, 18]",
    "allreduce_rank_of_shape": "different shapes: rank 0 [17, 6], rank 1 [17, 2, 3]",
    "allreduce_op": "different reduction ops (op=): rank 0 hvd.Sum, rank 1 hvd.Max",
    "allreduce_postscale": "(postscale_factor=): rank 0 1.0, rank 1 2.0",
    "allreduce_async_dtype": "different data types: rank 0 float32, rank 1 float64",
    "allgather_shape": "hvd.allgather: the ranks passed tensors whose shapes differ beyond the "
    "first dimension: rank 0 [2, 3], rank 1 [2, 4]",
    "allgather_dtype": "hvd.allgather: the ranks passed tensors of different data types: "
    "rank 0 int64, rank 1 float32",
    "broadcast_shape": "hvd.broadcast: the ranks passed tensors of different shapes: "
    "rank 0 [17, 10, 17], rank 1 [17, 20, 17]",
    "broadcast_dtype": "hvd.broadcast: the ranks passed tensors of different data types",
    "broadcast_root": "different root ranks (root_rank=): rank 0 0, rank 1 1",
    "names": "the ranks passed different names (name=): rank 0 and rank 1 differ",
    "collective": "the ranks called different collectives at the same point: rank 0 "
    "hvd.allreduce, rank 1 hvd.barrier. Every rank must call the same collectives",
}


@pytest.mark.parametrize("n", [2, 3])
def test_integer_arithmetic_odd_dtypes_and_mismatched_inputs_as_horovod(n: int) -> None:
    views = _runner(-n, "builtin").run(hvd_compat.arithmetic_types_and_mismatches)["views"]
    assert len(views) == n
    for rank, view in enumerate(views):
        assert view["reinit"] == [(rank, n), (rank, n)]  # init() again after shutdown()
        for key, expected in EXACT[n].items():
            assert view[key] == expected, (rank, key)
        # The same whatever the size: rank 0 holds the sum alone, or every rank's share
        # truncates before the sum.
        assert view["int64_average"] == view["int16_average"] == EXACT[n]["int32_average"]
        assert view["int_postscale"] == [-109, 7, 10, -1, 150]  # -109.5 -> -109
        assert view["int_prescale_average"] == [-3, 1, 2]
        assert view["bool_sum_min_max"] == [
            [True, True, False, True],
            [False, False, False, True],
            [True, True, False, True],
        ]
        assert view["int16_broadcast"] == [-300, 1]
        assert view["uint16_broadcast"] == [60001, 60001]
        assert view["bool_average"][:2] == ["HorovodInternalError", "RuntimeError"]
        assert (
            "bool tensors cannot be averaged or scaled: use op=hvd.Sum" in view["bool_average"][2]
        )
        assert set(view["errors"]) == set(MISMATCHES)
        for key, fragment in MISMATCHES.items():
            kind, base, message = view["errors"][key]
            assert (kind, base) == ("HorovodInternalError", "RuntimeError"), key
            assert fragment in message, (rank, key, message)
        assert f"(name='loss-{rank}' here)" in view["errors"]["names"][2]
        # Refused on every rank at once, as a ValueError (Horovod's type for it).
        assert view["duplicate"] == [
            "DuplicateNameError",
            "ValueError",
            "hvd.allreduce: an operation named 'dup' is still in flight on this rank; give each "
            "concurrent operation its own name=, or hvd.synchronize() the first before "
            "starting the next",
        ]
        assert view["duplicate_other_kind"] == [0]  # names are per kind of collective


@pytest.mark.parametrize("n", [2, 3])
def test_an_operation_started_alone_waits_past_a_barrier_for_the_others(n: int) -> None:
    views = _runner(-n, "builtin").run(hvd_compat.pending_across_barrier)["views"]
    assert len(views) == n
    total = float(sum(range(1, n + 1)))
    for rank, view in enumerate(views):
        # Each rank's second start under the name is refused while its first is pending
        # (rank 0's across the barrier, until the others start it), as in Horovod.
        assert view["duplicate"] == [
            "DuplicateNameError",
            "ValueError",
            "hvd.allreduce: an operation named 'late' is still in flight on this rank; give "
            "each concurrent operation its own name=, or hvd.synchronize() the first before "
            "starting the next",
        ], rank
        assert view["late"] == [total] and view["reused"] == [float(n)], rank
        # Waiting for an operation the others are not starting, while they are in barrier():
        # refused on every rank, not a hang, and the ranks go on in step.
        kind = "allreduce" if rank == 0 else "barrier"
        assert view["orphan"][:2] == ["HorovodInternalError", "RuntimeError"], rank
        assert (
            "the ranks called different collectives at the same point: rank 0 hvd.allreduce, "
            "rank 1 hvd.barrier"
        ) in view["orphan"][2], (kind, view["orphan"])
        assert view["after"] == [float(n)], rank


@pytest.mark.parametrize("n", [2, 3])
def test_join_stands_in_with_zeros_as_horovod(n: int) -> None:
    views = _runner(-n, "builtin").run(hvd_compat.join_stand_ins)["views"]
    # One rank's zeros in the sum, and the average still divides by n (truncating integers):
    # (n - 1) * [-73, 5, 7] / n.
    average = {2: [[-36, 2, 3], [0.75, -1.5]], 3: [[-48, 3, 4], [1.0, -2.0]]}[n]
    for rank, rounds in enumerate(views):
        assert [seen["first"] for seen in rounds] == list(range(n))
        for seen in rounds:
            first = seen["first"]
            # The rank that joined last: among those that joined together, the highest.
            last = max(set(range(n)) - {first})
            assert seen["returned"] == last and seen["agreed"] == [last] * n, (rank, seen)
            if rank == first:
                assert set(seen) == {"first", "returned", "agreed"}
                continue
            assert seen["average"] == average
            assert seen["sum"] == [n * (n + 1) // 2 - (first + 1)]
            for what in ("allgather", "barrier"):
                assert seen[what] == [
                    "HorovodInternalError",
                    "RuntimeError",
                    f"hvd.{what} cannot run while rank(s) {first} have joined (hvd.join): "
                    f"joined ranks stand in only for allreduce; call hvd.{what} before "
                    "hvd.join() on every rank",
                ]


# By hand: rows of arange(10).reshape(5, 2) dealt as Horovod deals them (2 ranks: 3 + 2
# rows; 3 ranks: 2 + 2 + 1), summed over the ranks.
SCATTERED = {
    2: [[[0, 2], [4, 6], [8, 10]], [[12, 14], [16, 18]]],
    3: [[[0, 3], [6, 9]], [[12, 15], [18, 21]], [[24, 27]]],
}
PRESCALED = {  # each rank's rows halved and truncated first
    2: [[[0, 0], [2, 2], [4, 4]], [[6, 6], [8, 8]]],
    3: [[[0, 0], [3, 3]], [[6, 6], [9, 9]], [[12, 12]]],
}


@pytest.mark.parametrize("n", [2, 3])
def test_grouped_alltoall_and_reducescatter_as_horovod(n: int) -> None:
    views = _runner(-n, "builtin").run(hvd_compat.grouped_alltoall_reducescatter)["views"]
    for rank, view in enumerate(views):
        assert view["grouped_average"] == {2: [[-36], [1.5]], 3: [[-24], [2.0]]}[n]
        assert view["grouped_inplace"] == [[n * (n - 1) // 2], [float(n)]]
        assert view["grouped_async"] == [[float(n)], [2.0 * n]]
        assert view["grouped_allgather"] == [
            [k for r in range(n) for k in range(r + 1)],
            [[r, r] for r in range(n)],
        ]
        assert view["reducescatter_sum"] == SCATTERED[n][rank]
        shift = (n - 1) / 2  # the mean of the ranks' "+ r"
        assert view["reducescatter_average"] == [
            [value / n + shift for value in row] for row in SCATTERED[n][rank]
        ]
        assert view["reducescatter_prescale"] == PRESCALED[n][rank]
        assert view["grouped_reducescatter"] == [
            SCATTERED[n][rank],
            [[float(v) for v in row] for row in SCATTERED[n][rank]],
        ]
        assert view["alltoall_equal"] == [
            v + 2 * rank for i in range(n) for v in (100 * i, 100 * i + 1)
        ]
        assert view["alltoall_int16"] == [-(i + 1) for i in range(n)]
        start = rank * (rank + 1) // 2  # rank j receives j + 1 rows from each rank
        assert view["alltoall_splits"] == [
            [10 * i + start + m for i in range(n) for m in range(rank + 1)],
            [rank + 1] * n,
            "torch.int32",
        ]
        assert view["alltoall_async"] == [[rank * (i + 1) for i in range(n)], [1] * n]
        errors = view["errors"]
        # A rank's own wrong splits are a ValueError there, as in Horovod.
        refused = {"alltoall_indivisible", "alltoall_float_splits"} | (
            {"alltoall_splits_one_rank"} if rank == 0 else set()
        )
        for key, (kind, base, _) in errors.items():
            expected = (
                ("InvalidArgumentError", "ValueError")
                if key in refused
                else (
                    "HorovodInternalError",
                    "RuntimeError",
                )
            )
            assert (kind, base) == expected, key
        assert errors["alltoall_indivisible"][2] == (
            f"hvd.alltoall without splits deals the first dimension equally, but {n + 1} rows "
            f"do not divide among {n} ranks: pass splits="
        )
        if rank == 0:
            assert errors["alltoall_splits_one_rank"][2] == (
                f"hvd.alltoall's splits {[n + 5] + [0] * (n - 1)} must give one count >= 0 per "
                f"rank ({n}) adding up to the first dimension ({n})"
            )
        else:
            assert (
                "the ranks passed splits that one rank refused"
                in (errors["alltoall_splits_one_rank"][2])
            )
        assert errors["alltoall_float_splits"][2] == (
            "hvd.alltoall's splits must be integers, not torch.float32"
        )
        assert errors["reducescatter_scalar"][2] == (
            "hvd.reducescatter needs a tensor with a first dimension"
        )
        assert "different shapes: rank 0 [4, 1], rank 1 [4, 2]" in errors["reducescatter_shape"][2]
        assert errors["grouped_dtype"][2] == (
            "hvd.allreduce: the ranks passed groups of tensors of different dtypes or shapes: "
            "rank 0 and rank 1 differ. Every rank must pass the same; nothing was sent, and the "
            "ranks can go on with further collectives"
        )
        assert view["after_errors"] == [float(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_gradients_through_collectives_as_horovod_defines_them(n: int) -> None:
    views = _runner(-n, "builtin").run(hvd_compat.gradients)["views"]
    mean = (n + 1) / 2  # of the ranks' weights r + 1
    total = n * (n + 1) / 2
    for rank, view in enumerate(views):
        assert view["allreduce_average"] == [mean] * 3
        assert view["allreduce_sum"] == [total] * 3
        # The averaged gradient of the gathered rows, this rank's rows of it.
        offset = rank * (rank + 1) // 2
        assert view["allgather"] == [[(offset + k) * mean] * 2 for k in range(rank + 1)]
        assert view["broadcast"] == [mean if rank == 1 else 0.0] * 2  # root 1 only
        assert view["alltoall"] == [rank + 1 + 100.0 * j for j in range(n)]
        shares = [[float(r + 1)] for r in range(n) for _ in range(2)]
        assert view["reducescatter_average"] == shares
        assert view["reducescatter_sum"] == [[v * n for v in row] for row in shares]
        assert view["grouped_allreduce"] == [[total] * 2, [2.0 * n]]
        # As reducescatter's, each member's: every rank's rows, times size() for Sum.
        assert view["grouped_reducescatter"] == [
            [[v * n for v in row] for row in shares],
            [float(n)] * n,
        ]


def test_broadcast_optimizer_state_for_every_torch_optimizer() -> None:
    result = _runner(-2, "builtin").run(hvd_compat.optimizer_states)
    ours, theirs = result["states"]
    for name in hvd_compat.OPTIMIZERS:
        if name == "SGD":
            # Stateless (no momentum): nothing is broadcast, as in Horovod, so each rank
            # keeps its own options.
            assert ours[name]["state"] == theirs[name]["state"] == {}
            assert [ours[name]["param_groups"][0]["lr"], theirs[name]["param_groups"][0]["lr"]] == [
                0.01,
                0.02,
            ]
            continue
        assert ours[name]["state"], name  # one step made state to broadcast
        assert theirs[name] == ours[name], name  # rank 1 holds rank 0's state and options
        assert theirs[name]["param_groups"][0]["lr"] == 0.01, name
    assert result["lbfgs"] == [
        "ValueError",
        "ValueError",
        "cannot broadcast torch.optim.LBFGS state",
    ]


@pytest.mark.parametrize("n", [2, 3])
def test_sparse_gradients_reduced_as_horovod(n: int) -> None:
    result = _runner(-n, "builtin").run(hvd_compat.sparse_gradients)
    assert result["size"] == n
    # Rank r's row r holds r + 1; the average over n ranks.
    rows = [(r + 1) / n if r < n else 0.0 for r in range(4) for _ in range(2)]
    # How often each id appears, averaged over the ranks (rank 0 and the others differ).
    counts = {
        2: [0, 1, 1, 1, 2, 0.5, 0, 0.5, 0, 1],
        3: [0, 1, 2 / 3, 1, 2, 1 / 3, 0, 2 / 3, 0, 1],
    }[n]
    first = result["views"][0]
    for view in result["views"]:
        assert sum(view["sparse_allreduce"], []) == pytest.approx(rows)
        for as_dense in (False, True):
            is_sparse, grad = view[f"sparse_as_dense={as_dense}"]
            assert is_sparse is True  # SparseAdam gets the sparse gradient it needs
            assert grad == pytest.approx(counts, rel=1e-6)
            # One replica: every rank stepped with the same reduced gradient.
            key = f"weights, sparse_as_dense={as_dense}"
            assert view[key] == first[key]
