"""A task's job carries its RunConfig once: built where the job is made and where it is
unpickled, while only the settings' plain form crosses."""

from __future__ import annotations

import dataclasses
import pickle

import cloudpickle

from sparktrain.config import RunConfig
from sparktrain.task.assignment import TaskJob


def _job() -> TaskJob:
    return TaskJob("r", 0, RunConfig(np=4, grace_period=3).to_json(), "h:1", b"k", b"p")


def test_the_run_config_is_built_once_per_job() -> None:
    job = _job()
    assert job.run_config is job.run_config
    assert job.run_config == RunConfig(np=4, grace_period=3)
    assert job.tasks == 4


def test_only_the_plain_settings_cross_and_the_other_side_builds_its_own() -> None:
    job = _job()
    for dumps in (pickle.dumps, cloudpickle.dumps):
        data = dumps(job)
        assert b"RunConfig" not in data
        there = pickle.loads(data)
        assert there == job and there.run_config == job.run_config
        assert there.run_config is not job.run_config


def test_a_replaced_job_rebuilds_its_run_config_from_its_settings() -> None:
    job = _job()
    smaller = dataclasses.replace(job, config=RunConfig(np=2).to_json())
    assert smaller.run_config.world_size == 2 and job.run_config.world_size == 4
