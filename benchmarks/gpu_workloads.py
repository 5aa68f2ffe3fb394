"""The functions ``gpu_suite.py`` times, run the same way in a sparktrain rank and in a plain
process: the seeds' workloads on generated MNIST-sized data, the first-step probe and the
mixed-precision step. Each returns plain data (numbers, lists, strings).

Nothing here imports torch at module level, so a plain process that imports this module pays
for torch where the first-step probe can see it.
"""

from __future__ import annotations

import os
import sys
import time
import types
from typing import Any


def device_of(cuda: bool) -> Any:
    """This process's device: its local GPU when ``cuda``, else the CPU."""
    import torch

    if not cuda:
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def sync(device: Any) -> None:
    """Wait for the device's queued kernels, so a timestamp means they ran."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def small_cnn() -> Any:
    """The seeds' LeNet-style network (``mnist_horovod.Net``), for 1x28x28 inputs."""
    from sparktrain.examples.mnist_horovod import Net

    return Net()


def generated_mnist(rows: int, test_rows: int, seed: int = 0) -> tuple[Any, Any]:
    """``(train, test)`` TensorDatasets shaped like MNIST: 1x28x28 floats, labels 0-9.

    A label is the quadrant of the image with the brightest mean, so the loss can fall.
    """
    import torch
    from torch.utils.data import TensorDataset

    gen = torch.Generator().manual_seed(seed)

    def make(n: int) -> TensorDataset:
        images = torch.rand(n, 1, 28, 28, generator=gen)
        quads = images.reshape(n, 2, 14, 2, 14).mean(dim=(2, 4)).reshape(n, 4)
        return TensorDataset(images, quads.argmax(dim=1) * 2 + (quads.max(dim=1).values > 0.5))

    return make(rows), make(test_rows)


class Stamped:
    """A DataLoader that notes ``time.perf_counter()`` as each batch is handed over.

    The gaps between stamps are whole steps (the loop's ``loss.item()`` waits for the GPU).
    """

    def __init__(self, loader: Any, stamps: list[float]) -> None:
        self._loader, self._stamps = loader, stamps

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Any:
        for batch in self._loader:
            self._stamps.append(time.perf_counter())
            yield batch
        self._stamps.append(time.perf_counter())


def steady_step(stamps: list[float], skip: int = 5) -> float:
    """The median gap between stamps after the first ``skip`` (warm-up) steps, in seconds."""
    gaps = sorted(b - a for a, b in zip(stamps[skip:], stamps[skip + 1 :], strict=False))
    gaps = gaps or sorted(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    return gaps[len(gaps) // 2] if gaps else float("nan")


def _patch_seed_modules(spec: dict[str, Any], stamps: list[float]) -> None:
    """Feed the seeds' modules generated data, and stamp their training loop's batches."""
    from sparktrain.examples import _data, mnist_horovod, torch_hvd_mnist

    train, test = generated_mnist(spec["rows"], spec["test_rows"])
    _data.load_mnist_like = lambda kind, data_dir=None: (train, test)  # type: ignore[assignment]
    original = mnist_horovod.train_one_epoch

    def stamped(model: Any, device: Any, loader: Any, *args: Any, **kwargs: Any) -> float:
        return original(model, device, Stamped(loader, stamps), *args, **kwargs)

    mnist_horovod.train_one_epoch = stamped  # type: ignore[assignment]
    torch_hvd_mnist.train_one_epoch = stamped  # type: ignore[assignment]


def seed_workload(spec: dict[str, Any]) -> dict[str, Any]:
    """One of the seeds' training functions, unchanged, on generated MNIST-sized data.

    ``spec["workload"]``: ``"databricks"`` (the notebook's ``train_hvd``: batch 100, SGD
    0.001 x ranks) or ``"alcf"`` (the workshop's ``train_mnist``: batch 64, a test pass per
    epoch). In a plain process ``horovod.torch`` is :func:`solo_horovod`'s world of one.
    """
    from sparktrain.examples import mnist_horovod, torch_hvd_mnist

    stamps: list[float] = []
    _patch_seed_modules(spec, stamps)
    began = time.perf_counter()
    if spec["workload"] == "databricks":
        settings = mnist_horovod.Settings("generated", None, spec["epochs"], 100)
        losses = mnist_horovod.train_hvd(mnist_horovod.NOTEBOOK_LR, spec["log_dir"], settings)
    else:
        out = torch_hvd_mnist.train_mnist(
            {
                **dict(data="generated", data_dir=None, batch_size=64, test_batch_size=1000),
                **dict(lr=torch_hvd_mnist.WORKSHOP_LR, momentum=0.5, cuda=spec["cuda"]),
                **dict(seed=42, log_interval=100, fp16_allreduce=False, use_adasum=False),
                **dict(gradient_predivide_factor=1.0, checkpoint_dir=spec["log_dir"]),
                "epochs": spec["epochs"],
            }
        )
        losses = [epoch["train_loss"] for epoch in out["epochs"]]
    return {
        "losses": losses,
        "function_s": time.perf_counter() - began,
        "steps": len(stamps),
        "step_s": steady_step(stamps),
        "device": str(device_of(spec["cuda"])),
    }


def solo_horovod() -> types.ModuleType:
    """``horovod.torch`` for a plain process: a world of one, every collective the identity."""
    hvd = types.ModuleType("horovod.torch")
    one, zero = (lambda: 1), (lambda: 0)
    hvd.init = lambda *a, **k: None  # type: ignore[attr-defined]
    hvd.size = hvd.local_size = one  # type: ignore[attr-defined]
    hvd.rank = hvd.local_rank = zero  # type: ignore[attr-defined]
    hvd.nccl_built = lambda: False  # type: ignore[attr-defined]
    hvd.allreduce = lambda tensor, *a, **k: tensor  # type: ignore[attr-defined]
    hvd.broadcast_parameters = lambda *a, **k: None  # type: ignore[attr-defined]
    hvd.broadcast_optimizer_state = lambda *a, **k: None  # type: ignore[attr-defined]
    hvd.DistributedOptimizer = lambda optimizer, *a, **k: optimizer  # type: ignore[attr-defined]
    hvd.Compression = types.SimpleNamespace(none=None, fp16=None)  # type: ignore[attr-defined]
    hvd.Average, hvd.Adasum = "average", "adasum"  # type: ignore[attr-defined]
    return hvd


def install_solo_horovod() -> None:
    """Make ``import horovod.torch`` give :func:`solo_horovod` in this (plain) process."""
    hvd = solo_horovod()
    parent = types.ModuleType("horovod")
    parent.torch = hvd  # type: ignore[attr-defined]
    sys.modules["horovod"], sys.modules["horovod.torch"] = parent, hvd


def first_step(spec: dict[str, Any]) -> dict[str, Any]:
    """From this function's entry to the first optimizer step, with a timestamp per part.

    Parts: torch import (none where the process had it already), the CUDA context, the
    communicator (``init_process_group`` and a first all-reduce: NCCL builds its communicator
    there; gloo on CPU), and the first kernels (the CNN to the device, one SGD step).
    Timestamps are ``time.time()``, comparable with the caller's on the same host.
    """
    stamps: dict[str, Any] = {"entered": time.time(), "torch_preloaded": "torch" in sys.modules}
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from sparktrain.examples.mnist_horovod import Net  # the CNN's module, with torch's

    stamps["torch"] = time.time()
    device = device_of(spec["cuda"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.empty(1, device=device)
    sync(device)
    stamps["context"] = time.time()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        ones = torch.ones(1, device=device)
        dist.all_reduce(ones)
        sync(device)
        stamps["communicator"] = time.time()
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.rand(spec["batch"], 1, 28, 28, device=device)
        target = torch.randint(0, 10, (spec["batch"],), device=device)
        F.nll_loss(model(data), target).backward()
        optimizer.step()
        sync(device)
        stamps["first_step"] = time.time()
    finally:
        dist.destroy_process_group()
    stamps["device"] = str(device)
    return stamps


def amp_steps(spec: dict[str, Any]) -> dict[str, Any]:
    """The CNN's steady step time in float32 and under ``torch.autocast(bfloat16)``.

    Returns:
        ``fp32_s`` and ``bf16_s`` (seconds a step, after warm-up steps) and ``dtype``, the
        dtype of the first convolution's output under autocast: ``bfloat16`` unless something
        defeated it (the network's last op, ``log_softmax``, runs in float32 on CUDA anyway).
    """
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    device = device_of(spec["cuda"])
    model = small_cnn().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    data = torch.rand(spec["batch"], 1, 28, 28, device=device)
    target = torch.randint(0, 10, (spec["batch"],), device=device)
    seen: dict[str, Any] = {"device": str(device)}
    conv: list[Any] = []
    model.conv1.register_forward_hook(lambda module, args, out: conv.append(out.dtype))

    def timed(autocast: bool, steps: int) -> float:
        began = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                out = model(data)
            seen["dtype" if autocast else "fp32_dtype"] = str(conv.pop())
            F.nll_loss(out.float(), target).backward()
            optimizer.step()
        sync(device)
        return (time.perf_counter() - began) / steps

    for autocast in (False, True):
        timed(autocast, spec["warmup"])
        seen["bf16_s" if autocast else "fp32_s"] = timed(autocast, spec["steps"])
    return seen
