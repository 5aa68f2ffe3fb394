"""``hvd.DistributedOptimizer``, ``broadcast_parameters`` and ``broadcast_optimizer_state``.

The optimizer averages gradients when ``step()`` (or ``synchronize()``) is called: every
parameter's gradient, compressed, is packed into a few flat buffers per device and dtype
(Horovod's tensor fusion) and each buffer is reduced with one collective. Gradients that
backward did not produce count as zeros, as in Horovod, so every process reduces the same
buffers. Gradients accumulated over several backward passes (``backward_passes_per_step``)
are reduced once, at the step.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from sparktrain.hvdcompat.basics import _checked
from sparktrain.hvdcompat.collectives import (
    _TORCH_OPS,
    Average,
    Sum,
    _finish_reduce,
    _no_process_set,
    broadcast_object,
    resolve_op,
)
from sparktrain.hvdcompat.compression import Compression, Compressor

# Largest flat buffer one collective carries (Horovod's default fusion threshold).
FUSION_BYTES = 64 << 20


class _GradientSync:
    """Mixed into the user's optimizer class: reduce gradients across processes, then step."""

    param_groups: list[dict[str, Any]]

    def _setup_sync(
        self,
        compression: type[Compressor],
        op: int,
        gradient_predivide_factor: float,
        sparse_as_dense: bool,
        backward_passes_per_step: int,
    ) -> None:
        self._compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.backward_passes_per_step = backward_passes_per_step
        self._should_synchronize = True
        self._synchronized = False

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate before a step."""
        self.backward_passes_per_step = passes

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    def synchronize(self) -> None:
        """Average (or sum, per ``op``) every parameter's gradient across processes now."""
        _checked()
        params = self._params()
        sparse = set()
        grads: list[torch.Tensor] = []
        for p in params:
            grad = p.grad
            if grad is None:
                grad = p.grad = torch.zeros_like(p)
            elif grad.is_sparse:
                if not self.sparse_as_dense:
                    raise NotImplementedError(
                        "sparse gradients are not supported by sparktrain's built-in "
                        "horovod.torch; pass sparse_as_dense=True to hvd.DistributedOptimizer"
                    )
                sparse.add(id(p))
                grad = p.grad = grad.to_dense()
            grads.append(grad)
        pre, post = 1.0, 1.0
        if self.op == Average:
            pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        packed: list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor, Any]]]] = []
        compressed = [
            (p, *self._compression.compress(g)) for p, g in zip(params, grads, strict=True)
        ]
        for bucket in _buckets(compressed):
            flat = torch.cat([c.reshape(-1) for _, c, _ in bucket])
            if pre != 1.0:
                flat.mul_(pre)
            packed.append((flat, bucket))
        works = [dist.all_reduce(flat, op=_TORCH_OPS[self.op], async_op=True) for flat, _ in packed]
        for work, (flat, bucket) in zip(works, packed, strict=True):
            work.wait()
            _finish_reduce(flat, self.op, post)
            offset = 0
            for p, sent, ctx in bucket:
                n = sent.numel()
                reduced = self._compression.decompress(flat[offset : offset + n].view_as(sent), ctx)
                offset += n
                if id(p) in sparse or p.grad is None:
                    p.grad = reduced.to_sparse() if id(p) in sparse else reduced
                else:
                    p.grad.copy_(reduced)
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Let ``step()`` use gradients already reduced by an explicit ``synchronize()``."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        """Reduce the gradients (unless inside :meth:`skip_synchronize`), then step."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called after optimizer.synchronize() without "
                    "optimizer.skip_synchronize(): the gradients are reduced twice",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super().step(closure)  # type: ignore[misc]

    def _local_step(self) -> Any:
        """The wrapped optimizer's own step, without reducing anything."""
        return super().step()  # type: ignore[misc]


def _buckets(
    items: list[tuple[torch.Tensor, torch.Tensor, Any]],
) -> Iterator[list[tuple[torch.Tensor, torch.Tensor, Any]]]:
    """Group (param, compressed grad, ctx) by device and dtype, at most FUSION_BYTES each."""
    groups: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, torch.Tensor, Any]]]
    groups = {}
    for item in items:
        groups.setdefault((item[1].device, item[1].dtype), []).append(item)
    for members in groups.values():
        bucket: list[tuple[torch.Tensor, torch.Tensor, Any]] = []
        size = 0
        for item in members:
            nbytes = item[1].numel() * item[1].element_size()
            if bucket and size + nbytes > FUSION_BYTES:
                yield bucket
                bucket, size = [], 0
            bucket.append(item)
            size += nbytes
        if bucket:
            yield bucket


def _check_names(optimizer: torch.optim.Optimizer, named_parameters: Any) -> None:
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError(
            "named_parameters must be (name, parameter) pairs, as model.named_parameters() gives"
        )
    names = [name for name, _ in named]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"named_parameters has duplicate names: {', '.join(duplicates)}")
    known = {id(p) for _, p in named}
    unnamed = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in known]
    if unnamed:
        raise ValueError(
            f"named_parameters was given, but {len(unnamed)} of the optimizer's parameters are "
            "not in it: pass model.named_parameters() of the model the optimizer updates"
        )


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
) -> torch.optim.Optimizer:
    """An optimizer of the same class that reduces gradients across processes before stepping.

    As with Horovod, the result is a new optimizer over ``optimizer.param_groups`` with fresh
    state: wrap first, then ``broadcast_optimizer_state``.

    Example:
        >>> opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        ... # doctest: +SKIP

    Args:
        optimizer: the optimizer to wrap.
        named_parameters: the model's ``named_parameters()``, checked to cover the optimizer.
        compression: ``hvd.Compression.none`` or ``hvd.Compression.fp16``.
        backward_passes_per_step: backward passes whose gradients accumulate per step.
        op: ``hvd.Average`` (default) or ``hvd.Sum``.
        gradient_predivide_factor: with Average, divides before the sum, multiplies after.
        num_groups: a fusion hint in Horovod; accepted, fusion here is by size.
        groups: a fusion hint in Horovod; accepted, fusion here is by size.
        sparse_as_dense: reduce sparse gradients as dense ones.
        process_set: only the global set is supported.

    Raises:
        NotImplementedError: for ``op=hvd.Adasum`` or a process set.
        ValueError: for bad ``named_parameters`` or ``backward_passes_per_step``.
    """
    _no_process_set(process_set, "DistributedOptimizer")
    op = resolve_op(op)
    if op not in (Average, Sum):
        raise ValueError("DistributedOptimizer's op must be hvd.Average or hvd.Sum")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor applies only with op=hvd.Average")
    if named_parameters is not None:
        _check_names(optimizer, named_parameters)
    base: Any = type(optimizer)
    cls: Any = type(base.__name__, (_GradientSync, base), {"__module__": base.__module__})
    wrapped = cls.__new__(cls)
    # Fresh state over the same parameter groups, as Horovod's wrapper has.
    base.__init__(wrapped, optimizer.param_groups)
    wrapped._setup_sync(
        compression, op, gradient_predivide_factor, sparse_as_dense, backward_passes_per_step
    )
    result: torch.optim.Optimizer = wrapped
    return result


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite the given tensors with ``root_rank``'s, in place.

    Args:
        params: ``model.state_dict()``, or ``(name, tensor)`` pairs such as
            ``model.named_parameters()``, or tensors.
        root_rank: the rank whose values win.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    tensors = [t for _, t in items if isinstance(t, torch.Tensor)]
    with torch.no_grad():
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for t in tensors:
            groups.setdefault((t.device, t.dtype), []).append(t)
        for members in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in members])
            dist.broadcast(flat, src=root_rank)
            offset = 0
            for t in members:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None
) -> None:
    """Make every process's optimizer state and options (``lr``, ...) ``root_rank``'s.

    An optimizer that has not stepped yet first gets its state made by one step on zero
    gradients, as Horovod does, so that there is state to broadcast.

    Raises:
        ValueError: for ``torch.optim.LBFGS``, as in Horovod.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        if isinstance(optimizer, _GradientSync):
            optimizer._local_step()
        else:
            optimizer.step()
    state = optimizer.state_dict()
    if not state["state"]:
        return
    is_root = _checked().rank == root_rank
    sent = _to_cpu(state) if is_root else None
    received = broadcast_object(sent, root_rank)
    if not is_root:
        optimizer.load_state_dict(received)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value
