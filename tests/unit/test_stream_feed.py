"""The task's stream to its ranks (sparktrain.data.stream): every row reaches exactly one rank,
flow is bounded by credits, the first batch arrives before the input ends, a killed rank or a
failing input stops everyone with a message naming the cause, and only key holders of this
account get in. Ranks are real forked processes; the feeder runs in the test process."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparktrain.data.stream import Feeder, RankStream, StreamError, protocol
from sparktrain.data.stream.spill import SPILLS, sweep

KEY = b"k" * 32
CTX = multiprocessing.get_context("fork")


def batch(start: int, rows: int) -> pa.RecordBatch:
    ids = pa.array(range(start, start + rows), pa.int64())
    return pa.RecordBatch.from_arrays([ids, pa.array([float(i) for i in range(rows)])], ["id", "x"])


def sized(sizes: list[int]) -> list[pa.RecordBatch]:
    out, start = [], 0
    for rows in sizes:
        out.append(batch(start, rows))
        start += rows
    return out


def read_all(address: str, index: int, out: Any, spill_dir: str, batch_size: int = 3) -> None:
    """A rank: read one epoch, put ("ok", ids) or ("error", message) on ``out``."""
    try:
        with RankStream(address, index, batch_size, key=KEY, local_dir=spill_dir) as loader:
            ids = [int(i) for b in loader for i in b["id"].tolist()]
        out.put(("ok", ids))
    except StreamError as exc:
        out.put(("error", str(exc)))


def start(target: Any, *args: Any) -> Any:
    process = CTX.Process(target=target, args=args, daemon=True)
    process.start()
    return process


def test_every_row_reaches_one_rank_round_robin_by_batch(tmp_path: Path) -> None:
    batches = sized([4, 1, 5, 3, 2, 6, 1])
    out = CTX.Queue()
    with Feeder(2, KEY, parent=tmp_path) as feeder:
        ranks = [start(read_all, feeder.address, i, out, str(tmp_path)) for i in range(2)]
        stats = feeder.feed(iter(batches))
    results = sorted((out.get(timeout=60) for _ in ranks), key=lambda r: r[1][:1])
    for process in ranks:
        process.join(60)
        assert process.exitcode == 0
    expected = [[int(i) for b in batches[r::2] for i in b.column(0).to_pylist()] for r in (0, 1)]
    assert sorted(r[1] for r in results) == sorted(expected)
    assert stats.batches == [4, 3]
    assert stats.rows == [sum(b.num_rows for b in batches[r::2]) for r in (0, 1)]
    assert stats.max_unread <= feeder.window


def slow_reader(address: str, consumed: Any, go: Any, out: Any) -> None:
    """A rank that takes one batch, then waits for ``go`` before reading the rest."""
    with RankStream(address, 0, 1, key=KEY, spill=False) as loader:
        count = 0
        for _ in loader:
            count += 1
            consumed.value = count
            if count == 1:
                go.wait(60)
        out.put(count)


def test_the_feeder_waits_for_a_rank_that_does_not_read() -> None:
    window, total = 2, 200
    consumed, go, out = CTX.Value("i", 0), CTX.Event(), CTX.Queue()
    produced = 0
    seen: list[tuple[int, int]] = []

    def source() -> Iterator[pa.RecordBatch]:
        nonlocal produced
        for i in range(total):
            produced += 1
            yield batch(i, 1)

    def on_wait(rank: int) -> None:
        # The rank reads nothing more until go: what was produced is bounded by what it took.
        seen.append((produced, consumed.value))
        go.set()

    with Feeder(1, KEY, window=window, on_wait=on_wait) as feeder:
        rank = start(slow_reader, feeder.address, consumed, go, out)
        stats = feeder.feed(source())
    assert out.get(timeout=60) == total
    rank.join(60)
    first_produced, first_consumed = seen[0]
    assert first_consumed <= 1
    # Beyond what the loop took: one decoded in the rank (its credit already sent), ``window``
    # unread in the socket, one in the feeder's hand. Never more, however long the input.
    assert first_produced <= first_consumed + window + 2
    assert all(p <= c + window + 2 for p, c in seen)
    assert stats.max_unread == window


def signal_first(address: str, received: Any, out: Any) -> None:
    with RankStream(address, 0, 2, key=KEY, spill=False) as loader:
        ids = []
        for b in loader:
            received.set()
            ids += b["id"].tolist()
    out.put(ids)


def test_the_first_batch_arrives_before_the_input_ends() -> None:
    received, out = CTX.Event(), CTX.Queue()

    def source() -> Iterator[pa.RecordBatch]:
        yield batch(0, 2)
        if not received.wait(60):
            raise AssertionError("the rank did not get the first batch while the input waited")
        yield batch(2, 2)

    with Feeder(1, KEY) as feeder:
        rank = start(signal_first, feeder.address, received, out)
        feeder.feed(source())
    assert out.get(timeout=60) == [0, 1, 2, 3]
    rank.join(60)


def killed_after_one(address: str, index: int, spill_dir: str) -> None:
    with RankStream(address, index, 1, key=KEY, local_dir=spill_dir) as loader:
        for _ in loader:
            os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_rank_stops_the_feeder_naming_it_and_the_other_rank(tmp_path: Path) -> None:
    out = CTX.Queue()
    with Feeder(2, KEY, parent=tmp_path, window=2) as feeder:
        folder = feeder.folder
        live = start(read_all, feeder.address, 0, out, str(tmp_path))
        doomed = start(killed_after_one, feeder.address, 1, str(tmp_path))
        with pytest.raises(StreamError, match="local rank 1 stopped reading") as caught:
            feeder.feed(batch(i, 1) for i in range(1000))
    assert "killed" in str(caught.value)
    kind, message = out.get(timeout=60)
    assert (kind, message) == ("error", str(caught.value))
    live.join(60)
    doomed.join(60)
    assert doomed.exitcode == -signal.SIGKILL
    assert not folder.exists()
    assert os.listdir(folder.parent) == []
    # The killed rank left its spill; the live one removed its own. A sweep takes the dead one's.
    spills = tmp_path / f"sparktrain-{os.getuid()}" / SPILLS
    left = sorted(spills.iterdir())
    assert len(left) == 1
    assert sweep(spills) == left
    assert list(spills.iterdir()) == []


def test_a_failing_input_reaches_the_ranks_and_the_task(tmp_path: Path) -> None:
    out = CTX.Queue()

    def source() -> Iterator[pa.RecordBatch]:
        yield batch(0, 3)
        raise RuntimeError("[CAST_INVALID_INPUT] 'abc' cannot be cast to INT")

    with Feeder(1, KEY, parent=tmp_path) as feeder:
        rank = start(read_all, feeder.address, 0, out, str(tmp_path))
        with pytest.raises(RuntimeError, match="CAST_INVALID_INPUT"):
            feeder.feed(source())
    kind, message = out.get(timeout=60)
    assert kind == "error"
    assert "the task's input failed: RuntimeError: [CAST_INVALID_INPUT]" in message
    rank.join(60)


def test_an_empty_partition_ends_every_rank_at_once(tmp_path: Path) -> None:
    out = CTX.Queue()
    with Feeder(3, KEY, parent=tmp_path) as feeder:
        ranks = [start(read_all, feeder.address, i, out, str(tmp_path)) for i in range(3)]
        stats = feeder.feed(iter([]))
    assert [out.get(timeout=60) for _ in ranks] == [("ok", [])] * 3
    assert stats.rows == [0, 0, 0]


def test_fewer_batches_than_ranks_leaves_some_ranks_empty(tmp_path: Path) -> None:
    out = CTX.Queue()
    with Feeder(3, KEY, parent=tmp_path) as feeder:
        ranks = [start(read_all, feeder.address, i, out, str(tmp_path)) for i in range(3)]
        feeder.feed(iter([batch(0, 2)]))
    assert sorted(out.get(timeout=60) for _ in ranks) == [("ok", []), ("ok", []), ("ok", [0, 1])]


def wrong_key(address: str, out: Any) -> None:
    try:
        with RankStream(address, 0, 1, key=b"not the key", spill=False):
            out.put("connected")
    except StreamError as exc:
        out.put(str(exc))


def test_a_process_without_the_key_is_refused_and_the_rank_still_gets_in(
    tmp_path: Path,
) -> None:
    out, intruder_out = CTX.Queue(), CTX.Queue()
    with Feeder(1, KEY, parent=tmp_path) as feeder:
        intruder = start(wrong_key, feeder.address, intruder_out)
        intruder.join(0)  # started first; which connects first does not matter
        rank = start(read_all, feeder.address, 0, out, str(tmp_path))
        feeder.feed(iter([batch(0, 2)]))
    assert out.get(timeout=60) == ("ok", [0, 1])
    message = intruder_out.get(timeout=60)
    assert "could not open its task's stream" in message
    rank.join(60)
    intruder.join(60)


def test_a_socket_without_the_key_cannot_pose_as_the_feeder(tmp_path: Path) -> None:
    path = str(tmp_path / "fake.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def fake_feeder() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(protocol.HELLO + os.urandom(protocol.NONCE))
            protocol.recv_exact(conn, 4 + protocol.NONCE + 32)
            conn.sendall(os.urandom(32))
            conn.recv(1)

    thread = threading.Thread(target=fake_feeder, daemon=True)
    thread.start()
    try:
        with pytest.raises(StreamError, match="feeder did not prove the run's key"):
            with RankStream(path, 0, 1, key=KEY, spill=False):
                pass
    finally:
        thread.join(60)
        server.close()


def test_another_account_cannot_reach_the_socket(tmp: Path, other: Any) -> None:
    with Feeder(1, KEY, parent=tmp) as feeder:
        probe = other.run(
            "/usr/bin/python3",
            "-c",
            "import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[1])\nexcept OSError as e:\n"
            "    print(type(e).__name__)\nelse:\n    print('connected')\n",
            feeder.address,
            check=False,
        )
    assert probe.stdout.strip() == "PermissionError", probe.stderr


def feed_then_die(parent: str, addresses: Any) -> None:
    """A task that sends two batches and is then SIGKILLed mid-stream."""

    def source() -> Iterator[pa.RecordBatch]:
        yield batch(0, 1)
        yield batch(1, 1)
        os.kill(os.getpid(), signal.SIGKILL)
        yield batch(2, 1)

    with Feeder(1, KEY, parent=parent) as feeder:
        addresses.put(feeder.address)
        feeder.feed(source())


def test_a_task_killed_mid_stream_stops_its_rank_and_its_folder_is_swept(
    tmp_path: Path,
) -> None:
    addresses = CTX.Queue()
    task = start(feed_then_die, str(tmp_path), addresses)
    address = addresses.get(timeout=60)
    got: list[int] = []
    with pytest.raises(StreamError, match="stream ended before its end.*failed or was cancelled"):
        with RankStream(address, 0, 1, key=KEY, local_dir=tmp_path) as loader:
            for b in loader:
                got += b["id"].tolist()
    task.join(60)
    assert task.exitcode == -signal.SIGKILL
    assert got == [0, 1]
    dead = Path(address).parent
    assert dead.is_dir()  # a SIGKILLed task removes nothing itself
    with Feeder(1, KEY, parent=tmp_path) as feeder:
        assert not dead.exists()
        assert os.listdir(feeder.folder.parent) == [feeder.folder.name]


def test_a_rank_that_never_connects_is_named_and_the_others_told(tmp_path: Path) -> None:
    out = CTX.Queue()
    with Feeder(2, KEY, parent=tmp_path, accept_timeout=1.0) as feeder:
        rank = start(read_all, feeder.address, 0, out, str(tmp_path))
        with pytest.raises(StreamError, match="local rank 1 did not connect") as caught:
            feeder.feed(iter([batch(0, 1)]))
    assert out.get(timeout=60) == ("error", str(caught.value))
    rank.join(60)


def test_a_socket_path_longer_than_a_socket_name_still_works(tmp_path: Path) -> None:
    parent = tmp_path / ("x" * 120)
    parent.mkdir()
    out = CTX.Queue()
    with Feeder(1, KEY, parent=parent) as feeder:
        assert len(feeder.address) > protocol.MAX_SOCKET_PATH
        rank = start(read_all, feeder.address, 0, out, str(tmp_path))
        feeder.feed(iter([batch(0, 2)]))
    assert out.get(timeout=60) == ("ok", [0, 1])
    rank.join(60)
    assert os.listdir(parent / f"sparktrain-{os.getuid()}" / "streams") == []
