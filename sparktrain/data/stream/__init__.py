"""Streaming a DataFrame's partitions to the ranks that train on them, with no shared copy.

This package is the data plane of training straight from a DataFrame: what a Spark barrier
task does with the Arrow record batches of its partition, and what its ranks read. It does
not start anything itself; the runner's stage over the DataFrame (below) uses it.

What is streamed, and how
    A task holds an iterator of ``pyarrow.RecordBatch`` from its partition (``mapInArrow(...,
    barrier=True)`` or ``rdd.barrier().mapPartitions`` over Arrow batches). A
    :class:`Feeder` opens a Unix socket in a fresh 0700 folder inside this user's private
    folder (:mod:`sparktrain.private_dir`:
    ``<TMPDIR>/sparktrain-<uid>/streams/feed-<pid>-XXXX/feed.sock``; a path too long for a
    socket's name is reached through a descriptor of its folder), and the task's ``k`` local
    ranks each connect with a :class:`RankStream`. The folder is locked by the feeder while it
    lives and removed when it ends; a task killed before that leaves it to the next feeder's
    sweep on the host (:mod:`sparktrain.locked_dirs`). Batch ``i`` of the partition goes to
    local rank ``i % k`` (round-robin by batch: which rank gets which rows depends only on the
    partition, not on timing; the cost is that the feeder waits on the slowest rank, which
    the ranks' collectives make them anyway). Each batch travels as one Arrow IPC
    record-batch message (``RecordBatch.serialize()``) after a schema message, and is read
    back on the rank as a view of the received bytes: no row is pickled or converted.

Who may connect
    The socket's folder admits only this user (another account cannot even reach the
    socket's name), the kernel's peer credentials must show this uid, and each connection
    must prove the run's key (:data:`sparktrain.contract.KEY_ENV`) by an HMAC of a fresh
    nonce, both ways (:mod:`.protocol`): a process of this user without the key can neither
    take a rank's rows nor pose as the feeder. After the handshake a Unix socket cannot be
    written into by a third process, so frames carry no MAC of their own.

Bounds
    Flow control is by credit: a rank returns one credit byte for each batch it takes off the
    socket, and the feeder sends a rank at most ``window`` (default 2) batches it has not
    taken. So the task holds the one batch in hand plus at most ``window`` per rank in the
    sockets, and a rank holds at most ``window`` batches unread and the one it decodes, plus
    its shuffle buffer (``2 * shuffle_buffer`` rows at most) and the rows of one batch being
    cut, whatever the partition's size; later epochs read the spill a batch at a time. A rank that does not read stops the feeder (and so Spark's reading of
    the partition): backpressure, not buffering. The first batch reaches a rank as soon as
    the partition's first batch exists.

Epochs after the first
    The rank (not the task) spills its own share of the first epoch as it arrives: each rank
    then writes only its rows, in parallel with the others, reads them back without a round
    trip through the task, and the task's work ends when the partition is read. The spill is
    an Arrow IPC file of the batches as they arrived, in a locked private folder
    ``<local_dir>/sparktrain-<uid>/stream-spills/spill-<pid>-XXXX/`` (``local_dir``: Spark's
    local dir on an executor, never shared storage), removed when the loader closes. A rank
    killed before it closes leaves the folder with its lock free; the next spill on the host
    removes it (:func:`sweep`), telling the dead from the living by the lock, not by pid
    (pid namespaces and reused pids cannot fool it). A
    full disk is an error naming the folder and the bytes needed.

Shuffle
    Within this rank's share of the partition, through a buffer of ``shuffle_buffer`` rows,
    drawn from ``numpy.random.default_rng([seed, epoch])``: different every epoch, the same
    order for the same seed and epoch (the spill keeps the batches as they arrived, so epoch
    ``e`` reads the same rows in the same order whether it streams or reads the spill).

Failures
    A rank that dies (SIGKILL included) is seen by the feeder as a closed connection: it
    raises :class:`StreamError` naming that rank, tells the other ranks (who raise the same
    message instead of waiting), and removes its folder. An input that raises (a failing
    Spark expression) is told to the ranks with its message, then re-raised in the task. A
    task that dies closes its sockets, so its ranks raise instead of waiting. Waits for the
    ranks to connect and for the handshake are bounded (``accept_timeout``,
    ``connect_timeout``); waits for the next batch or the next credit are not, as computing a
    partition or a training step may take any time: the peer's death, not a clock, ends them.

Driver side (``np < 0``)
    :func:`dataframe_batches` reads a DataFrame a partition at a time with
    ``toLocalIterator()`` and yields Arrow batches of a bounded number of rows, for a
    :class:`Feeder` run on the driver beside the local ranks.

What the runner integration must do (the next step)
    * Run the barrier stage over the DataFrame (``mapInArrow(..., barrier=True)``, or
      ``rdd.barrier().mapPartitions`` on a classic session), repartitioned to the stage's
      task count; in each task, open a ``Feeder(k, key, parent=<Spark local dir>)`` before
      starting the ranks, put ``Feeder.address`` and the local index in each rank's
      environment, and call ``Feeder.feed(batches)`` on a thread beside the supervision loop;
      a :class:`StreamError` from it is the task's failure (naming the rank).
    * Give each rank's ``data.loader()`` a ``RankStream(address, LOCAL_RANK, ...,
      local_dir=<Spark local dir>)``.
    * Agree on equal steps per epoch across tasks (row counts exchanged once a partition is
      read, or an end-of-epoch agreement), and the loader's resume state; neither is here.
"""

from sparktrain.data.stream.feeder import Feeder, FeedStats
from sparktrain.data.stream.loader import RankStream
from sparktrain.data.stream.protocol import StreamError
from sparktrain.data.stream.reader import dataframe_batches
from sparktrain.data.stream.spill import Spill, sweep

__all__ = [
    "FeedStats",
    "Feeder",
    "RankStream",
    "Spill",
    "StreamError",
    "dataframe_batches",
    "sweep",
]
