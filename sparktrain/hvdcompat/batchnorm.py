"""``hvd.SyncBatchNorm``: batch normalization whose statistics cover every rank's batch.

In training, the mean and variance of each channel are those of all ranks' batches together,
as if one process normalized the concatenated batch; the running statistics are updated with
them, the same on every rank. The statistics travel through the differentiable
``hvd.allreduce`` (op Sum), whose gradient is the sum of every rank's gradient, so each rank's
input gradient is that of the concatenated batch's loss (the sum of the ranks' losses), as in
Horovod. The gradients of ``weight`` and ``bias`` stay local: ``DistributedOptimizer``
reduces them with the others. In eval mode (with running statistics) it is a plain
BatchNorm. Unlike Horovod's, which needs CUDA, it runs on CPU tensors as well.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias
from torch.nn.modules.batchnorm import _BatchNorm

from sparktrain.hvdcompat.autograd import allreduce
from sparktrain.hvdcompat.basics import size
from sparktrain.hvdcompat.collectives import Sum


class SyncBatchNorm(_BatchNorm):
    """BatchNorm over the batches of every rank together (``hvd.SyncBatchNorm``).

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), hvd.SyncBatchNorm(8))
        ... # doctest: +SKIP

    Args:
        num_features: the channels ``C`` of inputs shaped ``(N, C, ...)``.
        eps: added to the variance for numerical stability.
        momentum: the running statistics' update rate; None for a cumulative average.
        affine: whether the module has a learnable ``weight`` and ``bias``.
        track_running_stats: whether it keeps running statistics (else batch statistics are
            used in eval mode too).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:  # noqa: A002 - torch's name
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
        """Normalize ``input`` with the statistics of every rank's batch (in training)."""
        self._check_input_dim(input)
        factor = 0.0  # the running statistics' update rate for this batch
        if self.training and self.track_running_stats:
            assert self.num_batches_tracked is not None  # kept when tracking running stats
            self.num_batches_tracked.add_(1)
            tracked = float(self.num_batches_tracked)
            factor = 1.0 / tracked if self.momentum is None else self.momentum
        if size() == 1 or (not self.training and self.track_running_stats):
            return F.batch_norm(
                input,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                self.training or not self.track_running_stats,
                factor,
                self.eps,
            )
        return self._synced(input, factor)

    def _synced(self, input: torch.Tensor, momentum: float) -> torch.Tensor:  # noqa: A002
        dims = [0, *range(2, input.dim())]
        shape = [1, -1] + [1] * (input.dim() - 2)
        count = input.numel() // input.shape[1]
        totals = allreduce(
            torch.cat([input.sum(dims), input.new_tensor([float(count)])]),
            op=Sum,
            name="sync_batch_norm.sum",
        )
        n = totals[-1]
        mean = totals[:-1] / n
        centered = input - mean.reshape(shape)
        var = allreduce((centered * centered).sum(dims), op=Sum, name="sync_batch_norm.var") / n
        if self.training and self.track_running_stats:
            with torch.no_grad():
                total = float(n)
                unbiased = var.detach() * (total / max(total - 1.0, 1.0))
                assert self.running_mean is not None and self.running_var is not None
                self.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
                self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)
        out = centered * torch.rsqrt(var + self.eps).reshape(shape)
        if self.weight is not None:
            out = out * self.weight.reshape(shape)
        if self.bias is not None:
            out = out + self.bias.reshape(shape)
        result: torch.Tensor = out
        return result
