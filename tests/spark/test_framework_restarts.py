"""Frameworks' own checkpoints across sparktrain's restarts (``max_restarts=1``), on 2 ranks on
the driver: Hugging Face's ``Trainer`` (``output_dir`` + ``resume_from_checkpoint``) and an
``accelerate`` loop (``save_state`` / ``load_state``). Lightning's (``ckpt_path="last"``) is
``test_lightning_killed_mid_epoch_resumes_from_its_checkpoint`` in test_frameworks.py.

Rank 1 is SIGKILLed mid-training in attempt 0 (tests/fixtures/framework_restarts.py); the
next attempt must start at the step of the framework's newest checkpoint, not at 0, and end
at the run's step count with one model on both ranks. Tiny models, a few steps.
"""

from __future__ import annotations

import pytest

from sparktrain import SparkRunner
from tests.fixtures import framework_restarts as fr

# No run here takes a minute; a hang fails the test instead of holding CI.
DEADLINE = 180
STEPS, KILL_AT = 6, 4


def killed_run(fn, root: str) -> tuple[SparkRunner, list[dict]]:
    """``fn`` on 2 ranks with one restart, rank 1 SIGKILLed at step KILL_AT of attempt 0."""
    runner = SparkRunner(np=-2, max_restarts=1, grace_period=2, timeout=DEADLINE)
    views = runner.run(fn, root, STEPS, kill_at_step=KILL_AT)["ranks"]
    assert [r.error is None for r in runner.attempts] == [False, True], runner.attempts
    assert "SIGKILL" in str(runner.attempts[0].cause)
    assert {v["attempt"] for v in views} == {1}
    return runner, views


def test_hugging_face_trainer_resumes_from_its_checkpoint(tmp_path):
    pytest.importorskip("transformers", reason="the frameworks extra is not installed")
    _, views = killed_run(fr.hf_resume, str(tmp_path / "hf"))
    # Attempt 1 found checkpoint-4 (the one before the kill) and went on from step 4.
    assert {v["resumed_from"] for v in views} == {f"checkpoint-{KILL_AT}"}
    assert {v["start_step"] for v in views} == {KILL_AT}
    assert {v["global_step"] for v in views} == {STEPS}
    sums = [v["checksum"] for v in views]
    assert sums == pytest.approx([sums[0]] * 2, rel=1e-6), views


def test_accelerate_loop_resumes_from_its_state(tmp_path):
    pytest.importorskip("accelerate", reason="the frameworks extra is not installed")
    _, views = killed_run(fr.accelerate_resume, str(tmp_path / "killed"))
    assert {v["start_step"] for v in views} == {KILL_AT}
    assert {v["global_step"] for v in views} == {STEPS}
    # The loop is deterministic (no shuffle, SGD): resumed, it ends where an unbroken run ends.
    unbroken = SparkRunner(np=-2, timeout=DEADLINE).run(
        fr.accelerate_resume, str(tmp_path / "unbroken"), STEPS
    )["ranks"]
    assert {v["start_step"] for v in unbroken} == {0}
    assert [v["checksum"] for v in views] == pytest.approx(
        [v["checksum"] for v in unbroken], rel=1e-6
    )
