"""``hvd.DistributedOptimizer``: the user's optimizer class, reducing gradients before it steps.

Gradients are reduced in fused buckets that start while backward runs (see
:mod:`sparktrain.hvdcompat.fusion`); ``step()`` or ``synchronize()`` waits for them.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from sparktrain.hvdcompat.basics import _checked
from sparktrain.hvdcompat.collectives import Average, Sum, resolve_op
from sparktrain.hvdcompat.compression import Compression, Compressor
from sparktrain.hvdcompat.fusion import GradientReducer


class _GradientSync:
    """Mixed into the user's optimizer class: reduce gradients across processes, then step."""

    param_groups: list[dict[str, Any]]
    _parameter_names: dict[torch.Tensor, str]

    def _setup_sync(
        self,
        compression: type[Compressor],
        op: int,
        gradient_predivide_factor: float,
        sparse_as_dense: bool,
        backward_passes_per_step: int,
        process_set: Any = None,
    ) -> None:
        self._compression = compression
        self.process_set = process_set
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.backward_passes_per_step = backward_passes_per_step
        self._should_synchronize = True
        self._synchronized = False
        self._reducer: GradientReducer | None = None
        self._reducer = self._new_reducer()

    def _new_reducer(self) -> GradientReducer:
        if self._reducer is not None:
            self._reducer.remove()
        pre, post = 1.0, 1.0
        if self.op == Average:
            pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if self.process_set is not None and not self.process_set.included():
            params = []  # as in Horovod: no hooks outside the set, the gradients stay local
        return GradientReducer(
            params,
            self._compression,
            self.op,
            pre,
            post,
            self.sparse_as_dense,
            self.backward_passes_per_step,
            self.process_set,
        )

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate before a step."""
        self.backward_passes_per_step = passes
        self._reducer = self._new_reducer()

    def synchronize(self) -> None:
        """Average (or sum, per ``op``) every parameter's gradient across processes now."""
        _checked()
        if self.process_set is not None and not self.process_set.included():
            self._synchronized = True  # as in Horovod: nothing to reduce outside the set
            return
        reducer = self._reducer
        assert reducer is not None  # set by _setup_sync
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if not reducer.pending and [id(p) for p in params] != [id(p) for p in reducer.params]:
            reducer = self._reducer = self._new_reducer()  # param groups changed since
        reducer.reduce()
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
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(): the gradients are reduced again; step inside "
                    "`with optimizer.skip_synchronize():` after synchronizing",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super().step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients; refused while their reduction is under way, as in Horovod.

        Raises:
            RuntimeError: between ``loss.backward()`` and ``step()`` / ``synchronize()``.
        """
        if self._reducer is not None and self._reducer.pending:
            raise RuntimeError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(): the gradients are being reduced"
            )
        super().zero_grad(set_to_none)  # type: ignore[misc]

    def _local_step(self) -> Any:
        """The wrapped optimizer's own step, without reducing anything."""
        return super().step()  # type: ignore[misc]


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
        process_set: the ranks whose gradients are reduced together (every rank by default);
            on a rank outside it, ``step()`` steps on the local gradients.

    Raises:
        NotImplementedError: for ``op=hvd.Adasum``.
        ValueError: for bad ``named_parameters`` or ``backward_passes_per_step``.
    """
    op = resolve_op(op)
    if op not in (Average, Sum):
        raise ValueError("DistributedOptimizer's op must be hvd.Average or hvd.Sum")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor applies only with op=hvd.Average")
    named = None
    if named_parameters is not None:
        named = list(named_parameters)
        _check_names(optimizer, named)
    base: Any = type(optimizer)
    cls: Any = type(base.__name__, (_GradientSync, base), {"__module__": base.__module__})
    wrapped = cls.__new__(cls)
    # Fresh state over the same parameter groups, as Horovod's wrapper has.
    base.__init__(wrapped, optimizer.param_groups)
    wrapped._setup_sync(
        compression,
        op,
        gradient_predivide_factor,
        sparse_as_dense,
        backward_passes_per_step,
        process_set,
    )
    if named is None:  # Horovod's names for unnamed parameters
        named = [
            (f"allreduce.noname.{i}.{j}", p)
            for i, group in enumerate(wrapped.param_groups)
            for j, p in enumerate(group["params"])
        ]
    # Each parameter's name, as Horovod's optimizer has it (some code reads it).
    wrapped._parameter_names = {p: name for name, p in named}
    result: torch.optim.Optimizer = wrapped
    return result
