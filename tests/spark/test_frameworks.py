"""The frameworks people train with, unchanged, on 2 ranks: Lightning's Trainer (the host form
and TorchDistributor's form), Hugging Face's Trainer, an accelerate loop, FSDP.

Each run returns what the framework itself saw on every rank (world size, ranks, device) and
a checksum of the trained parameters on every rank (see tests/fixtures/framework_trainers.py).
Every run is a few optimizer steps on generated data: CI time matters. Some run on the Spark
executors of the session fixture, some on the driver (np=-2): both start ranks the same way.
"""

from __future__ import annotations

import dataclasses
import signal

import pytest

from sparktrain import SparkRunner, WorkerFailedError
from sparktrain.config import RunConfig
from tests.conftest import ranks
from tests.fixtures import framework_trainers as ft

pytest.importorskip("lightning", reason="the frameworks extra is not installed")
pytest.importorskip("transformers", reason="the frameworks extra is not installed")
pytest.importorskip("accelerate", reason="the frameworks extra is not installed")

needs_node_setting = pytest.mark.skipif(
    "node" not in {f.name for f in dataclasses.fields(RunConfig)},
    reason="SparkRunner's node setting (node='task': every Spark task a node) is not here yet",
)

# No framework run here takes a minute; a hang fails the test instead of holding CI.
DEADLINE = 180


def assert_one_model(views: list[dict], key: str = "checksum") -> None:
    """Every rank ended with the same parameters."""
    sums = [v[key] for v in views]
    assert sums == pytest.approx([sums[0]] * len(sums), rel=1e-6), views


@pytest.mark.spark
def test_lightning_host_form_on_executors(spark, tmp_path):
    """Trainer(devices=2, num_nodes=1): both executors of local-cluster run on one host."""
    views = SparkRunner(np=2, timeout=DEADLINE).run(ft.lightning_fit, str(tmp_path), 2, 1)["ranks"]
    assert [
        (v["world_size"], v["global_rank"], v["local_rank"], v["node_rank"]) for v in views
    ] == [
        (2, 0, 0, 0),
        (2, 1, 1, 0),
    ]
    assert [v["rank_env"] for v in views] == ["0", "1"]  # Lightning's rank is sparktrain's
    # TORCHELASTIC_RUN_ID is set: Lightning reads RANK and GROUP_RANK, as under torchrun.
    assert {v["environment"] for v in views} == {"TorchElasticEnvironment"}
    assert {v["device"] for v in views} == {"cpu"}
    assert {v["global_step"] for v in views} == {ft.SAMPLES // ft.BATCH // 2}
    assert_one_model(views)


@pytest.mark.spark
@needs_node_setting
def test_lightning_torchdistributor_form_on_executors(spark, tmp_path):
    """Trainer(devices=1, num_nodes=2), as TorchDistributor's documentation writes it, with
    node='task': every Spark task a node of its own, Lightning on its torchrun environment."""
    runner = SparkRunner(np=2, node="task", timeout=DEADLINE)
    views = runner.run(ft.lightning_fit, str(tmp_path), 1, 2)["ranks"]
    assert [
        (v["world_size"], v["global_rank"], v["local_rank"], v["node_rank"]) for v in views
    ] == [
        (2, 0, 0, 0),
        (2, 1, 0, 1),
    ]
    assert {v["environment"] for v in views} == {"TorchElasticEnvironment"}
    assert {v["device"] for v in views} == {"cpu"}
    assert_one_model(views)


def test_lightning_killed_mid_epoch_resumes_from_its_checkpoint(tmp_path):
    """Rank 1 is SIGKILLed at global step 6 (epoch 2 of 2, 4 steps each) in attempt 0; attempt
    1 fits again with ckpt_path="last" and continues from Lightning's own checkpoint."""
    runner = SparkRunner(np=-2, max_restarts=1, grace_period=2, timeout=DEADLINE)
    result = runner.run(ft.lightning_fit, str(tmp_path), 2, 1, epochs=2, kill_at_step=6)
    views = result["ranks"]
    assert [r.error is None for r in runner.attempts] == [False, True], runner.attempts
    assert "SIGKILL" in str(runner.attempts[0].cause)
    assert {v["attempt"] for v in views} == {1}
    # Resumed mid-epoch: the step after the last checkpoint before the kill, not step 0.
    assert {(v["start_epoch"], v["start_step"]) for v in views} == {(1, 6)}
    assert {v["global_step"] for v in views} == {8}
    assert {v["environment"] for v in views} == {"TorchElasticEnvironment"}
    assert [(v["world_size"], v["global_rank"], v["local_rank"]) for v in views] == [
        (2, 0, 0),
        (2, 1, 1),
    ]
    assert_one_model(views)


def test_lightning_layout_mismatch_names_the_fix(tmp_path):
    """Trainer(devices=1, num_nodes=1) on 2 ranks of one host: sparktrain's explanation, not
    Lightning's IndexError from inside its strategy."""
    with pytest.raises(WorkerFailedError) as caught:
        SparkRunner(np=-2, timeout=DEADLINE).run(ft.lightning_fit, str(tmp_path), 1, 1)
    root = caught.value.root_cause
    assert root.exc_type == "ConfigurationError"
    assert "Trainer(devices=1, num_nodes=1) asks for 1 process(es)" in root.message
    assert "sparktrain started 2 rank(s): 1 node(s) of 2 rank(s) each" in root.message
    assert "Write Trainer(devices=2, num_nodes=1) for this layout" in root.message
    assert "node='task'" in root.message and "Trainer(devices=1, num_nodes=2)" in root.message
    assert "IndexError" not in str(caught.value)


@pytest.mark.spark
def test_hugging_face_trainer_on_executors(spark, tmp_path):
    views = SparkRunner(np=2, timeout=DEADLINE).run(ft.hf_train, str(tmp_path))["ranks"]
    assert [(v["world_size"], v["process_index"], v["local_process_index"]) for v in views] == [
        (2, 0, 0),
        (2, 1, 1),
    ]
    assert {v["device"] for v in views} == {"cpu:0"}  # transformers' name for the CPU
    assert {v["global_step"] for v in views} == {3}
    assert_one_model(views)


@pytest.mark.parametrize("mode", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_accelerate_loop(mode, request):
    """Accelerator(cpu=True): distributed on CPU (without cpu=True each rank trains alone)."""
    if mode == "spark":
        request.getfixturevalue("spark")
    views = SparkRunner(np=ranks(mode, 2), timeout=DEADLINE).run(ft.accelerate_loop)["ranks"]
    assert [(v["num_processes"], v["process_index"], v["local_process_index"]) for v in views] == [
        (2, 0, 0),
        (2, 1, 1),
    ]
    assert {v["distributed_type"] for v in views} == {"DistributedType.MULTI_CPU"}
    assert {v["device"] for v in views} == {"cpu:0"} or {v["device"] for v in views} == {"cpu"}
    assert {v["steps"] for v in views} == {3}
    assert_one_model(views)


@pytest.mark.parametrize("mode", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_fsdp_shards_and_matches_one_process(mode, request):
    """FSDP on gloo: each rank holds half the parameters, and the trained model equals the
    same steps taken by one process on the ranks' combined batches."""
    if mode == "spark":
        request.getfixturevalue("spark")
    result = SparkRunner(np=ranks(mode, 2), timeout=DEADLINE).run(ft.fsdp_train)
    views = result["ranks"]
    assert [(v["world_size"], v["rank"], v["local_rank"]) for v in views] == [(2, 0, 0), (2, 1, 1)]
    assert sum(v["shard_numel"] for v in views) == views[0]["full_numel"]
    assert all(v["shard_numel"] < v["full_numel"] for v in views)
    assert result["deviation_from_one_process"] < 1e-5
    assert_one_model(views)


@pytest.mark.parametrize(
    ("mode", "how"), [pytest.param("spark", "abort", marks=pytest.mark.spark), ("local", "kill")]
)
def test_rank_dying_after_it_returned_ends_the_run(mode, how, request):
    """Rank 1 returns, then dies at exit (SIGABRT as a C++ terminate, or SIGKILL): the run
    ends (the deadline would fail it otherwise) and says so, instead of returning rank 0's
    value as if all went well."""
    if mode == "spark":
        request.getfixturevalue("spark")
    with pytest.raises(WorkerFailedError) as caught:
        SparkRunner(np=ranks(mode, 2), timeout=DEADLINE).run(ft.abort_after_return, how)
    failures = caught.value.failures
    assert set(failures) == {1}, failures
    signum = signal.SIGABRT if how == "abort" else signal.SIGKILL
    assert failures[1].exit_code == -signum
    assert signal.Signals(signum).name in str(caught.value)
