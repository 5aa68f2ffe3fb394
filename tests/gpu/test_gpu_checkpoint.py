"""On a CUDA machine: an asynchronous save stages CUDA tensors into pinned host memory, apart
from the originals, and writes what was staged. Skipped where there is no GPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sparktrain import checkpoint  # noqa: E402
from sparktrain.checkpoint import _background  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU: staging into pinned host memory is for CUDA tensors",
    ),
]


@pytest.fixture(autouse=True)
def _run_id(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(checkpoint.RUN_ID_ENV, "gpu-staging")
    yield
    _background.settle()  # no save of one test is left in flight for the next


def test_staging_copies_cuda_tensors_into_pinned_host_memory() -> None:
    weights = torch.arange(4096, dtype=torch.float32, device="cuda")
    bias = torch.ones(3, dtype=torch.float16, device="cuda")
    state = {"w": weights, "tied": weights, "nested": [{"b": bias}], "cpu": torch.zeros(2)}

    staged = _background.stage(state)

    for tensor in (staged["w"], staged["nested"][0]["b"]):
        assert tensor.device.type == "cpu" and tensor.is_pinned(), tensor.device
    assert staged["nested"][0]["b"].dtype == torch.float16
    assert staged["tied"] is staged["w"]  # one tensor twice stays one copy
    assert not staged["cpu"].is_pinned()  # CPU tensors are cloned, not pinned
    weights.mul_(-1)  # training changes the GPU tensors at once
    bias.zero_()
    torch.cuda.synchronize()
    assert torch.equal(staged["w"], torch.arange(4096, dtype=torch.float32))
    assert torch.equal(staged["nested"][0]["b"], torch.ones(3, dtype=torch.float16))


def test_an_asynchronous_save_of_cuda_tensors_writes_the_staged_values(tmp_path: Path) -> None:
    weights = torch.arange(1024, dtype=torch.float32, device="cuda")
    handle = checkpoint.save({"w": weights}, tmp_path / "ckpt", 1, asynchronous=True)
    weights.fill_(-1.0)  # after save returns: the checkpoint holds the values at the call
    handle.wait()

    loaded = checkpoint.load_latest(tmp_path / "ckpt", map_location="cpu")

    assert loaded is not None and loaded.step == 1
    assert torch.equal(loaded.state["w"], torch.arange(1024, dtype=torch.float32))
