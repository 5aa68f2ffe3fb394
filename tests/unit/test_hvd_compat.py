"""sparktrain's built-in horovod.torch, the parts that need no process group: compression,
fusion buckets, argument checks and the errors for what is not provided. (The collectives
themselves are compared with Horovod's in tests/spark/test_hvd_compat.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from sparktrain import contract
from sparktrain.hvdcompat import SHIM_DIR, api, basics, dtypes, fusion


def test_fp16_compression_round_trip() -> None:
    grad = torch.tensor([1.0, 1e-3, -2.5], dtype=torch.float32)
    sent, ctx = api.Compression.fp16.compress(grad)
    assert sent.dtype == torch.float16
    back = api.Compression.fp16.decompress(sent, ctx)
    assert back.dtype == torch.float32
    assert back.tolist() == pytest.approx(grad.tolist(), rel=1e-3)
    ints = torch.tensor([1, 2])
    sent, ctx = api.Compression.fp16.compress(ints)
    assert sent.dtype == torch.int64 and api.Compression.fp16.decompress(sent, ctx) is sent
    same, ctx = api.Compression.none.compress(grad)
    assert same is grad and api.Compression.none.decompress(same, ctx) is grad


def test_fusion_buckets_split_by_dtype_and_size_last_parameter_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fusion, "FUSION_BYTES", 40)  # ten float32 values
    a, b, c, d = torch.zeros(3), torch.zeros(4, dtype=torch.float16), torch.zeros(4), torch.zeros(4)
    buckets = fusion.plan_buckets([a, b, c, d])
    # Reverse order; d+c fill a float32 bucket; b travels apart; a starts the next float32 one.
    assert [[id(p) for p in bucket] for bucket in buckets] == [[id(d), id(c)], [id(b)], [id(a)]]
    big, small = torch.zeros(20), torch.zeros(1)
    assert [len(bucket) for bucket in fusion.plan_buckets([small, big])] == [1, 1]


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_distributed_optimizer_checks_named_parameters() -> None:
    model, opt = _model_and_optimizer()
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="duplicate names: w"):
        api.DistributedOptimizer(opt, named_parameters=[("w", p) for _, p in named])
    with pytest.raises(ValueError, match="2 of the optimizer's parameters are not in it"):
        api.DistributedOptimizer(opt, named_parameters=named[:2])
    with pytest.raises(ValueError, match=r"\(name, parameter\) pairs"):
        api.DistributedOptimizer(opt, named_parameters=[p for _, p in named])
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        api.DistributedOptimizer(opt, backward_passes_per_step=0)


def test_distributed_optimizer_is_the_optimizer_class_with_fresh_state() -> None:
    model, opt = _model_and_optimizer()
    opt.state[next(model.parameters())]["momentum_buffer"] = torch.zeros(1)
    wrapped = api.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    assert isinstance(wrapped, torch.optim.SGD) and type(wrapped).__name__ == "SGD"
    assert wrapped.param_groups[0]["lr"] == 0.1 and not wrapped.state


def test_adasum_is_refused_naming_the_alternatives() -> None:
    _, opt = _model_and_optimizer()
    with pytest.raises(NotImplementedError, match=r"op=hvd.Adasum is not supported .* hvd.Sum"):
        api.DistributedOptimizer(opt, op=api.Adasum)


def test_missing_parts_raise_not_implemented_naming_themselves() -> None:
    with pytest.raises(NotImplementedError, match="hvd.mpi_lib_v2 is not supported"):
        api.mpi_lib_v2  # noqa: B018 - the attribute access is what raises
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        api.no_such_thing  # noqa: B018


def test_queries_before_init_say_to_call_init() -> None:
    for query in (api.rank, api.size, api.local_rank, api.cross_size):
        with pytest.raises(ValueError, match=r"use hvd.init\(\)"):
            query()
    assert api.is_initialized() is False


def test_init_without_a_place_names_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HOROVOD_RANK", "RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="none of HOROVOD_RANK, RANK is set"):
        basics.init()


def test_the_shim_shadows_installed_horovod_where_it_is_on_the_path() -> None:
    # What the worker does on a rank (sys.path first): a fresh interpreter, like a rank.
    code = (
        f"import sys; sys.path.insert(0, {str(SHIM_DIR)!r}); import horovod.torch as hvd; "
        "print(hvd.__file__); print(hvd.DistributedOptimizer.__module__)"
    )
    env = {**os.environ, contract.HOROVOD_SHIM_ENV: "Horovod is not installed"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        str(SHIM_DIR / "horovod" / "torch" / "__init__.py"),
        "sparktrain.hvdcompat.optimizer",
    ]
    assert proc.stderr.splitlines() == [
        "sparktrain: horovod.torch here is sparktrain's built-in implementation on "
        "torch.distributed (Horovod is not installed)"
    ]


def test_worker_puts_the_shim_first_only_when_the_backend_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sparktrain.worker import bootstrap

    monkeypatch.setattr(sys, "path", ["/somewhere"])
    monkeypatch.setenv("PYTHONPATH", "/user/lib")
    monkeypatch.delenv(contract.HOROVOD_SHIM_ENV, raising=False)
    bootstrap._shadow_horovod()
    assert sys.path == ["/somewhere"] and os.environ["PYTHONPATH"] == "/user/lib"
    monkeypatch.setenv(contract.HOROVOD_SHIM_ENV, "Horovod is not installed")
    bootstrap._shadow_horovod()
    assert sys.path == [str(SHIM_DIR), "/somewhere"]
    assert os.environ["PYTHONPATH"] == f"{SHIM_DIR}{os.pathsep}/user/lib"


def test_optimizer_parameter_names_as_horovod_names_them() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    groups = [{"params": model[0].parameters()}, {"params": model[1].parameters()}]
    unnamed = api.DistributedOptimizer(torch.optim.SGD(groups, lr=0.1))
    params = list(model.parameters())
    assert unnamed._parameter_names == {
        params[0]: "allreduce.noname.0.0",
        params[1]: "allreduce.noname.0.1",
        params[2]: "allreduce.noname.1.0",
        params[3]: "allreduce.noname.1.1",
    }
    named = api.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    assert named._parameter_names == {
        params[0]: "0.weight",
        params[1]: "0.bias",
        params[2]: "1.weight",
        params[3]: "1.bias",
    }


def test_scaling_truncates_integers_toward_zero_as_horovod() -> None:
    ints = torch.tensor([-73, 73, -1, 5], dtype=torch.int32)
    dtypes.scale(ints, 0.5)
    assert ints.tolist() == [-36, 36, 0, 2]  # floor would give -37 and -1
    shorts = torch.tensor([-7, 7], dtype=torch.int16)
    dtypes.scale(shorts, 1 / 3)
    assert shorts.dtype == torch.int16 and shorts.tolist() == [-2, 2]
    halves = torch.tensor([1.0, 3.0], dtype=torch.float16)
    dtypes.scale(halves, 0.1)
    # float32 products rounded to float16, as Horovod's CPU scaling of float16 does
    assert halves.tolist() == [0.0999755859375, 0.300048828125]
    same = torch.tensor([5])
    dtypes.scale(same, 1.0)
    assert same.tolist() == [5]
    dtypes.check_scalable(torch.bool, 1.0, 1.0)  # a plain sum of bools is fine
    with pytest.raises(api.HorovodInternalError, match="bool tensors cannot be averaged"):
        dtypes.check_scalable(torch.bool, 1.0, 0.5)


def test_dtypes_gloo_lacks_travel_widened_or_as_float16_bits() -> None:
    shorts = torch.tensor([-300, 2], dtype=torch.int16)
    widened = dtypes.for_reduction(shorts)
    assert widened.dtype == torch.int32 and widened.tolist() == [-300, 2]
    floats = torch.ones(2)
    assert dtypes.for_reduction(floats) is floats and dtypes.for_moving(floats) is floats
    moved = dtypes.for_moving(shorts)
    assert moved.dtype == torch.float16 and moved.data_ptr() == shorts.data_ptr()
    assert dtypes.restore(moved, torch.int16).tolist() == [-300, 2]
    assert dtypes.for_reduction(torch.tensor([True])).dtype == torch.int32


def test_process_sets_before_registration() -> None:
    unregistered = api.ProcessSet(iter([2, 0, 1]))
    assert unregistered.ranks == [0, 1, 2]  # sorted, as Horovod keeps them
    assert (unregistered.process_set_id, unregistered.size(), unregistered.rank()) == (
        None,
        None,
        None,
    )
    assert str(unregistered) == "ProcessSet(process_set_id=None, ranks=[0, 1, 2], mpi_comm=None)"
    assert api.global_process_set.process_set_id == 0
    # Neither the global set nor one never registered can be removed.
    assert api.remove_process_set(api.global_process_set) is False
    assert api.remove_process_set(unregistered) is False
    with pytest.raises(ValueError, match="mpi4py communicators need MPI"):
        api.ProcessSet(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"a list of integer ranks, not \[0, 1.5\]"):
        api.ProcessSet([1.5, 0])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"use hvd.init\(\)"):
        api.add_process_set([0])
    with pytest.raises(ValueError, match=r"use hvd.init\(\)"):
        api.start_timeline("unused.json")
