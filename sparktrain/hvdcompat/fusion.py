"""Gradient fusion for ``hvd.DistributedOptimizer``: fixed buckets, reduced as backward fills them.

The parameters are split once into buckets of one device and dtype (at most
:data:`FUSION_BYTES` each), in the reverse of their order, which is roughly the order backward
produces their gradients. A hook on each parameter counts its backward passes; when every
gradient of a bucket is complete, the bucket is packed into one flat buffer and its reduction
starts, while backward goes on. Buckets start strictly in order, so every process issues the
same collectives in the same order whatever order its hooks fire in. :meth:`reduce` starts the
buckets backward did not complete (a missing gradient counts as zeros, as in Horovod), waits
for all of them and writes the results back into ``p.grad``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from sparktrain.hvdcompat.collectives import _TORCH_OPS, _finish_reduce
from sparktrain.hvdcompat.compression import Compressor
from sparktrain.hvdcompat.grouped import sparse_allreduce_async
from sparktrain.hvdcompat.process_sets import scope_of

# Largest bucket, in bytes of the uncompressed gradients. Torch DDP's default: large enough
# that per-collective costs stay small, small enough that early buckets overlap backward.
FUSION_BYTES = 25 << 20


def plan_buckets(params: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Parameters grouped by device and dtype into buckets of at most FUSION_BYTES, last
    parameter first; the same plan on every process that has the same model."""
    done: list[list[torch.Tensor]] = []
    filling: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    sizes: dict[tuple[torch.device, torch.dtype], int] = {}
    for p in reversed(params):
        key = (p.device, p.dtype)
        nbytes = p.numel() * p.element_size()
        if key in filling and sizes[key] + nbytes > FUSION_BYTES:
            done.append(filling.pop(key))
        if key not in filling:
            filling[key], sizes[key] = [], 0
        filling[key].append(p)
        sizes[key] += nbytes
    return done + list(filling.values())


@dataclasses.dataclass
class _Flight:
    """One bucket's reduction in progress."""

    work: Any
    flat: torch.Tensor | None
    # (parameter, what was sent, compression context, whether its gradient was sparse)
    items: list[tuple[torch.Tensor, torch.Tensor, Any, bool]]
    # (parameter, what gives its reduced sparse gradient), for sparse gradients kept sparse
    sparse: list[tuple[torch.Tensor, Callable[[], torch.Tensor]]]


class GradientReducer:
    """Reduces the gradients of ``params`` across processes, overlapping backward.

    Args:
        params: the parameters whose gradients are reduced (those that require grad).
        compression: applied to each gradient before it is packed.
        op: ``Average`` or ``Sum`` (see :mod:`sparktrain.hvdcompat.collectives`).
        prescale: multiplies the packed gradients before the reduction.
        postscale: multiplies the result (and 1/size for Average).
        sparse_as_dense: reduce sparse gradients as dense ones (else gather every rank's
            indices and values, as Horovod does).
        passes: backward passes per step; a bucket starts after its last one.
        process_set: the ranks to reduce over (None: every rank); this rank is a member.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        compression: type[Compressor],
        op: int,
        prescale: float,
        postscale: float,
        sparse_as_dense: bool,
        passes: int,
        process_set: Any = None,
    ) -> None:
        self.params = list(params)
        self.process_set = process_set
        self.compression = compression
        self.op = op
        self.prescale, self.postscale = prescale, postscale
        self.sparse_as_dense = sparse_as_dense
        self.passes = passes
        self.buckets = plan_buckets(self.params)
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self._lock = threading.Lock()
        self._count: dict[int, int] = {}
        self._ready = [0] * len(self.buckets)
        self._flights: list[_Flight | None] = [None] * len(self.buckets)
        self._next = 0
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]

    @property
    def pending(self) -> bool:
        """Whether reductions have started that :meth:`reduce` has not finished."""
        return self._next > 0

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _on_grad(self, p: torch.Tensor) -> None:
        with self._lock:
            key = id(p)
            count = self._count.get(key, 0) + 1
            if count > self.passes:
                raise RuntimeError(
                    f"gradients were computed more than backward_passes_per_step={self.passes} "
                    "times before optimizer.step(): raise backward_passes_per_step in "
                    "hvd.DistributedOptimizer to accumulate them, or step after each backward"
                )
            self._count[key] = count
            if count < self.passes:
                return
            self._ready[self._bucket_of[key]] += 1
            while self._next < len(self.buckets) and self._ready[self._next] == len(
                self.buckets[self._next]
            ):
                self._launch(self._next)
                self._next += 1

    def _launch(self, index: int) -> None:
        items = []
        kept_sparse = []
        for position, p in enumerate(self.buckets[index]):
            grad = p.grad
            if grad is None:
                grad = p.grad = torch.zeros_like(p)
            sparse = grad.is_sparse
            if sparse and not self.sparse_as_dense:
                # As Horovod: every rank's indices and values, gathered.
                name = f"DistributedOptimizer.sparse.{index}.{position}"
                kept_sparse.append(
                    (p, sparse_allreduce_async(grad, name, self.op, self.process_set))
                )
                continue
            if sparse:
                grad = grad.to_dense()
            sent, ctx = self.compression.compress(grad)
            items.append((p, sent, ctx, sparse))
        flat, work = None, None
        if items:
            flat = torch.cat([sent.reshape(-1) for _, sent, _, _ in items])
            if self.prescale != 1.0:
                flat.mul_(self.prescale)
            group = scope_of(self.process_set, "DistributedOptimizer").group
            work = dist.all_reduce(flat, op=_TORCH_OPS[self.op], group=group, async_op=True)
        self._flights[index] = _Flight(work, flat, items, kept_sparse)

    def reduce(self) -> None:
        """Finish every bucket's reduction and write the results into ``p.grad``."""
        with self._lock:
            while self._next < len(self.buckets):
                self._launch(self._next)
                self._next += 1
            flights, self._flights = self._flights, [None] * len(self.buckets)
            self._next = 0
            self._ready = [0] * len(self.buckets)
            self._count.clear()
        for flight in flights:
            if flight is None:
                continue
            for p, waiter in flight.sparse:
                p.grad = waiter()
            if flight.work is None or flight.flat is None:
                continue
            flight.work.wait()
            size = scope_of(self.process_set, "DistributedOptimizer").size
            _finish_reduce(flight.flat, self.op, self.postscale, size)
            offset = 0
            for p, sent, ctx, sparse in flight.items:
                n = sent.numel()
                reduced = self.compression.decompress(
                    flight.flat[offset : offset + n].view_as(sent), ctx
                )
                offset += n
                if sparse or p.grad is None:
                    p.grad = reduced.to_sparse() if sparse else reduced
                else:
                    p.grad.copy_(reduced)
