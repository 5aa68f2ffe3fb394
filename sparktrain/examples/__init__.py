"""Runnable ports of the tutorials sparktrain grew from, each ``python -m sparktrain.examples.X``.

=====================  ===================================================================
``digits``             the main job: a small CNN on scikit-learn's bundled digits through
                       ``SparkRunner(np=2)`` on an embedded local Spark, checkpoints, metrics,
                       summary table and training-curve PNG
``mnist_horovod``      Databricks' HorovodRunner notebook: single-node ``train()``, then
                       ``train_hvd()`` through ``HorovodRunner``
``torch_hvd_mnist``    the Horovod workshop script: ``metric_average``, ``--fp16-allreduce``,
                       optimizer-state broadcast, rank-0 checkpoints, time per epoch
``ddp_trainer``        the DDP tutorial: a ``Trainer`` around ``DistributedDataParallel`` with
                       ResNet-18 (torchvision) or a small ResNet on CIFAR-10-shaped data
``dist_torch_starter`` the "workers" starter, with ``--gpus`` instead of an edited line
``resume_demo``        a rank is killed mid-run; ``max_restarts`` resumes from the checkpoint;
                       ``--elastic``: a host lost for good, the run goes on smaller and grows
                       back when it returns, every row of every epoch trained once
=====================  ===================================================================

Each module has ``main(argv=None)`` that returns a dict of results, so it can be called from
Python as well as from a shell. None of them downloads anything: MNIST / CIFAR-10 are used
from ``--data-dir`` when present (and torchvision is importable); otherwise the digits, or
generated CIFAR-shaped tensors, stand in, and the first line printed says which.

:func:`spark_session` is the small local Spark they start when no SparkSession is active
(``local-cluster[2,1,1024]``, UI off, errors-only logs); notebooks can use it too.
"""

from sparktrain.examples._common import spark_session

__all__ = ["spark_session"]
