"""RunConfig: validation, the precedence of its sources, text forms, defaults.conf, JSON."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from sparktrain import SparkRunner
from sparktrain import config as config_module
from sparktrain.backends import backend_names, check_backend_name, get_backend
from sparktrain.config import (
    RESERVED_ENV,
    RunConfig,
    conf_key,
    env_key,
    render_defaults_conf,
)
from sparktrain.config.conf_file import parse_conf_text
from sparktrain.errors import ConfigurationError, SparkTrainError
from sparktrain.units import (
    format_duration,
    format_size,
    parse_bool,
    parse_duration,
    parse_size,
)


@pytest.fixture(autouse=True)
def _no_sparktrain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings in the developer's environment must not leak into these tests."""
    for name in list(os.environ):
        if name.startswith("SPARKTRAIN_"):
            monkeypatch.delenv(name)


# --- np ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("np", [0, 1.5, True, False, "2", None, 2.0])
def test_bad_np_is_refused_with_the_fix(np: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=np)
    message = str(info.value)
    assert "non-zero integer" in message
    assert "np=N" in message and "np=-N" in message  # says what positive/negative mean
    assert repr(np) in message


@pytest.mark.parametrize(
    "np, local, world", [(1, False, 1), (4, False, 4), (-1, True, 1), (-3, True, 3)]
)
def test_np_sign_picks_where_ranks_run(np: int, local: bool, world: int) -> None:
    config = RunConfig(np=np)
    assert config.local is local
    assert config.world_size == world


def test_configuration_error_is_a_value_error_in_the_tree() -> None:
    assert issubclass(ConfigurationError, SparkTrainError)
    assert issubclass(ConfigurationError, ValueError)


def test_spark_runner_refuses_np_zero_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="non-zero integer"):
        SparkRunner(np=0)


def test_spark_runner_refuses_bad_settings_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="start_timeout"):
        SparkRunner(np=-1, start_timeout=-5)
    with pytest.raises(ConfigurationError, match="unknown setting 'grace'"):
        SparkRunner(np=-1, grace=3)
    runner = SparkRunner(np=-2, grace_period=1.5)
    assert runner.config.grace_period == 1.5 and runner.config.world_size == 2


# --- other fields ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "refuse",
    [
        lambda name: SparkRunner(np=1, backend=name),  # at construction, before any Spark work
        lambda name: SparkRunner(np=-1, backend=name),
        check_backend_name,
        get_backend,
    ],
    ids=["SparkRunner", "SparkRunner local", "check_backend_name", "get_backend"],
)
def test_unknown_backend_lists_the_choices_and_the_conf_key(refuse: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        refuse("mpi4py")
    message = str(info.value)
    assert "'mpi4py'" in message
    assert "torch" in message and "horovod" in message
    assert "argument backend=" in message and "spark.sparktrain.backend" in message


def test_run_config_holds_any_backend_name_and_the_registry_judges_it() -> None:
    assert RunConfig(np=1, backend="mpi4py").backend == "mpi4py"
    with pytest.raises(ConfigurationError, match="backend must be a string"):
        RunConfig(np=1, backend=5)  # type: ignore[arg-type]
    for name in backend_names():
        check_backend_name(name)


def test_config_imports_nothing_of_sparktrain_but_errors_and_leaves() -> None:
    # Backends import config (for RunConfig's type): config importing them would be a loop.
    # mpi_args (the extra_mpi_args check) imports nothing of sparktrain.
    package = Path(config_module.__file__).parent
    imported: set[str] = set()
    for module in package.glob("*.py"):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) if n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    outside = {n for n in imported if n.startswith("sparktrain") and "sparktrain.config" not in n}
    assert outside == {
        "sparktrain.contract",
        "sparktrain.errors",
        "sparktrain.units",
    }
    tree = ast.parse((package / "mpi_args.py").read_text("utf-8"))
    assert not any(
        isinstance(node, (ast.Import, ast.ImportFrom)) and "sparktrain" in ast.unparse(node)
        for node in ast.walk(tree)
    )


@pytest.mark.parametrize("verbosity", ["ALL", "none", "", "log_callback"])
def test_bad_verbosity(verbosity: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=1, driver_log_verbosity=verbosity)
    assert str(info.value) == (
        f"driver_log_verbosity must be one of all, log_callback_only; got {verbosity!r} "
        "(argument driver_log_verbosity=, or spark.sparktrain.driverLogVerbosity)"
    )


@pytest.mark.parametrize(
    "field", ["start_timeout", "capacity_wait", "grace_period", "timeout", "stall_timeout"]
)
@pytest.mark.parametrize("value", [0, -1, -0.5, True, "soon", "-5m", "0s", "10 minutes"])
def test_non_positive_or_non_numeric_durations(field: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=1, **{field: value})
    message = str(info.value)
    assert f"{field} must be a positive number of seconds" in message
    assert f"argument {field}=" in message and conf_key(field) in message


@pytest.mark.parametrize(
    "field", ["start_timeout", "capacity_wait", "grace_period", "timeout", "stall_timeout"]
)
@pytest.mark.parametrize(
    ("text", "seconds"),
    [("400", 400.0), ("30s", 30.0), ("10m", 600.0), ("1h", 3600.0), ("500ms", 0.5)],
)
def test_durations_as_text_read_as_spark_settings_are(
    field: str, text: str, seconds: float
) -> None:
    """An argument takes the same forms as spark.sparktrain.* (timeout="10m")."""
    assert getattr(RunConfig(np=1, **{field: text}), field) == seconds
    assert getattr(RunConfig.resolve(1, {}, environ={env_key(field): text}), field) == seconds


@pytest.mark.parametrize(
    ("text", "size"), [("64m", 64 << 20), ("1048576", 1 << 20), ("2g", 2 << 30)]
)
def test_sizes_as_text(text: str, size: int) -> None:
    assert RunConfig(np=1, max_result_bytes=text).max_result_bytes == size
    assert RunConfig(np=1, max_payload_bytes=text).max_payload_bytes == size
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=1, max_result_bytes="lots")
    assert str(info.value) == (
        "max_result_bytes must be a positive int; got 'lots' "
        "(argument max_result_bytes=, or spark.sparktrain.maxResultBytes)"
    )


def test_timeout_none_as_text_means_no_limit() -> None:
    assert RunConfig(np=1, timeout="none").timeout is None


def test_timeout_none_means_no_limit_but_other_durations_need_a_value() -> None:
    assert RunConfig(np=1, timeout=None).timeout is None
    with pytest.raises(ConfigurationError, match="start_timeout"):
        RunConfig(np=1, start_timeout=None)  # type: ignore[arg-type]


def test_kept_results_ttl_is_a_duration_of_three_days_unless_set() -> None:
    assert RunConfig(np=1).kept_results_ttl == 3 * 86400
    assert RunConfig(np=1, kept_results_ttl="12h").kept_results_ttl == 43200
    assert RunConfig(np=1, kept_results_ttl="none").kept_results_ttl is None
    conf = {"spark.sparktrain.keptResultsTtl": "1d"}
    assert RunConfig.resolve(1, {}, spark_conf=conf, environ={}).kept_results_ttl == 86400
    environ = {"SPARKTRAIN_KEPT_RESULTS_TTL": "none"}
    assert RunConfig.resolve(1, {}, environ=environ).kept_results_ttl is None
    with pytest.raises(
        ConfigurationError,
        match=r"kept_results_ttl must be a positive .*"
        r"spark\.sparktrain\.keptResultsTtl",
    ):
        RunConfig(np=1, kept_results_ttl="0s")


@pytest.mark.parametrize("value", [None, "off", "OFF "])
def test_stall_timeout_off(value: Any) -> None:
    assert RunConfig(np=1, stall_timeout=value).stall_timeout is None
    # A keyword argument of None means "the default", so "off" is how a runner turns it off.
    assert RunConfig.resolve(1, {"stall_timeout": "off"}, environ={}).stall_timeout is None


@pytest.mark.parametrize("action", ["warn", "fail"])
def test_stall_actions(action: str) -> None:
    assert RunConfig(np=1, stall_action=action).stall_action == action


@pytest.mark.parametrize("action", ["WARN", "kill", "", None])
def test_bad_stall_action_names_the_choices_and_the_key(action: Any) -> None:
    with pytest.raises(ConfigurationError, match="stall_action must be one of warn, fail") as info:
        RunConfig(np=1, stall_action=action)
    assert "spark.sparktrain.stallAction" in str(info.value)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_durations_are_refused(value: float) -> None:
    with pytest.raises(ConfigurationError):
        RunConfig(np=1, timeout=value)
    with pytest.raises(ConfigurationError):
        RunConfig(np=1, start_timeout=value)


@pytest.mark.parametrize(
    ("field", "key"),
    [("max_payload_bytes", "maxPayloadBytes"), ("max_result_bytes", "maxResultBytes")],
)
@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0, "0"),
        (-1, "-1"),
        (1.5, "1.5"),
        (True, "True"),
        ("256 apples", "'256 apples'"),
        ("0k", "0"),
    ],
)
def test_bad_sizes(field: str, key: str, value: Any, shown: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=1, **{field: value})
    assert str(info.value) == (
        f"{field} must be a positive int; got {shown} "
        f"(argument {field}=, or spark.sparktrain.{key})"
    )


@pytest.mark.parametrize("value", [-1, 1.0, True, "2"])
def test_bad_max_restarts(value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=1, max_restarts=value)
    assert str(info.value) == (
        f"max_restarts must be an integer >= 0; got {value!r} "
        "(argument max_restarts=, or spark.sparktrain.maxRestarts)"
    )


@pytest.mark.parametrize("value", ["true", "auto", 2])
def test_bad_use_gpu(value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=1, use_gpu=value)
    assert str(info.value) == (
        f"use_gpu must be True, False or None; got {value!r} "
        "(argument use_gpu=, or spark.sparktrain.useGpu)"
    )


def test_restart_on_user_error_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=1, restart_on_user_error="false")  # type: ignore[arg-type]
    assert str(info.value) == (
        "restart_on_user_error must be True or False; got 'false' "
        "(argument restart_on_user_error=, or spark.sparktrain.restartOnUserError)"
    )


def test_launcher_must_be_a_string_or_none() -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=1, launcher=5)  # type: ignore[arg-type]
    assert str(info.value) == (
        "launcher must be a string or None; got 5 "
        "(argument launcher=, or spark.sparktrain.launcher)"
    )


@pytest.mark.parametrize("value", ["false", "true", "", 0, 1])
def test_warm_start_refuses_what_is_not_a_bool(value: Any) -> None:
    """A string such as "false" would be truthy: it is refused, not taken as warm start on."""
    with pytest.raises(ConfigurationError) as info:
        SparkRunner(np=2, warm_start=value)
    assert str(info.value) == (
        f"warm_start must be True or False; got {value!r} "
        "(argument warm_start=, or spark.sparktrain.warmStart)"
    )


def test_warm_start_refuses_none_where_no_default_fills_it_in() -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=2, warm_start=None)  # type: ignore[arg-type]
    assert str(info.value) == (
        "warm_start must be True or False; got None "
        "(argument warm_start=, or spark.sparktrain.warmStart)"
    )


@pytest.mark.parametrize("value", [False, True])
def test_warm_start_keeps_a_bool_given_as_argument(value: bool) -> None:
    assert SparkRunner(np=2, warm_start=value).config.warm_start is value
    assert RunConfig(np=2, warm_start=value).warm_start is value


@pytest.mark.parametrize(("text", "value"), [("false", False), (" FALSE ", False), ("true", True)])
def test_warm_start_reads_the_text_of_the_spark_conf_and_the_environment(
    text: str, value: bool
) -> None:
    conf = {"spark.sparktrain.warmStart": text}
    assert RunConfig.resolve(2, {}, spark_conf=conf, environ={}).warm_start is value
    environ = {"SPARKTRAIN_WARM_START": text}
    assert RunConfig.resolve(2, {}, environ=environ).warm_start is value


def test_warm_start_is_on_unless_set() -> None:
    assert RunConfig(np=2).warm_start is True


# --- env ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(RESERVED_ENV))
def test_reserved_env_keys_are_refused(key: str) -> None:
    with pytest.raises(ConfigurationError, match=f"env may not set {key}: sparktrain sets it"):
        RunConfig(np=1, env={key: "3"})


def test_reserved_env_covers_the_torch_rendezvous_variables() -> None:
    assert {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    } <= RESERVED_ENV


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"A": 1}, "'A': 1 is not (convert with str())"),
        ({"A": None}, "'A': None is not"),
        ({"A": b"x"}, "'A': b'x' is not"),
        ({1: "x"}, "1: 'x' is not"),
    ],
)
def test_env_values_must_be_strings(env: dict[Any, Any], fragment: str) -> None:
    with pytest.raises(ConfigurationError, match="env must map str to str") as info:
        RunConfig(np=1, env=env)
    assert fragment in str(info.value)


def test_env_must_be_a_mapping() -> None:
    with pytest.raises(ConfigurationError, match="env must be a dict of str to str"):
        RunConfig(np=1, env=[("A", "1")])  # type: ignore[arg-type]


def test_env_is_copied_and_read_only() -> None:
    given = {"A": "1"}
    config = RunConfig(np=1, env=given)
    given["B"] = "2"
    assert dict(config.env) == {"A": "1"}
    with pytest.raises(TypeError):
        config.env["C"] = "3"  # type: ignore[index]


def test_config_is_frozen() -> None:
    config = RunConfig(np=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.np = 2  # type: ignore[misc]


# --- precedence: defaults < Spark conf < env < kwargs -----------------------------------------


def test_builtin_defaults_apply_with_no_other_source() -> None:
    config = RunConfig.resolve(2, spark_conf={}, environ={})
    assert config.backend == "torch"
    assert config.driver_log_verbosity == "all"
    assert config.start_timeout == 120.0
    assert config.capacity_wait == 60.0
    assert config.grace_period == 10.0
    assert config.max_payload_bytes == 256 << 20
    assert config.max_result_bytes == 256 << 20
    assert config.max_restarts == 0
    assert config.timeout is None and config.use_gpu is None and config.launcher is None
    assert config.stall_timeout == 300.0 and config.stall_action == "warn"


# (spark conf, environ, overrides) -> expected start_timeout
PRECEDENCE = {
    "defaults only": ({}, {}, {}, 120.0),
    "spark conf over defaults": ({"spark.sparktrain.startTimeout": "5s"}, {}, {}, 5.0),
    "env over spark conf": (
        {"spark.sparktrain.startTimeout": "5s"},
        {"SPARKTRAIN_START_TIMEOUT": "7"},
        {},
        7.0,
    ),
    "kwargs over env": (
        {"spark.sparktrain.startTimeout": "5s"},
        {"SPARKTRAIN_START_TIMEOUT": "7"},
        {"start_timeout": 9},
        9.0,
    ),
    "kwargs over spark conf": (
        {"spark.sparktrain.startTimeout": "5s"},
        {},
        {"start_timeout": 9},
        9.0,
    ),
    "None kwarg keeps the lower layer": (
        {},
        {"SPARKTRAIN_START_TIMEOUT": "2m"},
        {"start_timeout": None},
        120.0,
    ),
}


@pytest.mark.parametrize("name", list(PRECEDENCE))
def test_precedence(name: str) -> None:
    spark_conf, environ, overrides, expected = PRECEDENCE[name]
    config = RunConfig.resolve(1, overrides, spark_conf=spark_conf, environ=environ)
    assert config.start_timeout == expected


def test_precedence_is_per_field() -> None:
    config = RunConfig.resolve(
        -2,
        {"grace_period": 3, "backend": None},
        spark_conf={
            "spark.sparktrain.backend": "horovod",
            "spark.sparktrain.gracePeriod": "1m",
            "spark.sparktrain.maxResultBytes": "1k",
            "spark.sparktrain.useGpu": "false",
            "spark.other.key": "ignored",
        },
        environ={
            "SPARKTRAIN_MAX_RESULT_BYTES": "2k",
            "SPARKTRAIN_TIMEOUT": "1h",
            "SPARKTRAIN_LAUNCHER": "mpi",
        },
    )
    assert config.backend == "horovod"  # spark conf; the None kwarg does not override it
    assert config.grace_period == 3.0  # kwarg over spark conf
    assert config.max_result_bytes == 2048  # env over spark conf
    assert config.timeout == 3600.0  # env alone
    assert config.use_gpu is False
    assert config.launcher == "mpi"
    assert config.np == -2


def test_resolve_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKTRAIN_GRACE_PERIOD", "250ms")
    assert RunConfig.resolve(1).grace_period == 0.25
    # An explicit environ replaces os.environ entirely.
    assert RunConfig.resolve(1, environ={}).grace_period == 10.0


def test_resolve_refuses_unknown_settings_and_np_override() -> None:
    with pytest.raises(ConfigurationError, match="unknown setting 'start_timout'"):
        RunConfig.resolve(1, {"start_timout": 3}, environ={})
    with pytest.raises(ConfigurationError, match="unknown setting 'np'"):
        RunConfig.resolve(1, {"np": 3}, environ={})


def test_a_misspelt_setting_is_told_the_nearest_one() -> None:
    with pytest.raises(ConfigurationError) as info:
        SparkRunner(np=-1, timout=60)
    assert str(info.value) == "unknown setting 'timout' (did you mean 'timeout'?)"
    with pytest.raises(ConfigurationError, match=r"'start_timout' \(did you mean 'start_timeout'"):
        RunConfig.resolve(1, {"start_timout": 3}, environ={})
    # Nothing near: every setting is listed instead.
    with pytest.raises(ConfigurationError) as info:
        SparkRunner(np=-1, colour="red")
    assert "unknown setting 'colour'; the settings are: " in str(info.value)
    assert "queue_wait" in str(info.value) and "did you mean" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "read"), [(None, None), ("none", None), (0, 0), ("0", 0.0), ("90s", 90.0), (2.5, 2.5)]
)
def test_queue_wait_reads_a_duration_zero_or_none(value: Any, read: float | None) -> None:
    assert RunConfig.resolve(1, {"queue_wait": value}, environ={}).queue_wait == read


@pytest.mark.parametrize("value", [-1, "soon", float("inf"), True])
def test_queue_wait_refuses_what_is_not_a_duration(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="queue_wait must be .*spark.sparktrain.queueWait"):
        RunConfig.resolve(1, {"queue_wait": value}, environ={})


@pytest.mark.parametrize(
    "source, where",
    [
        ("spark", "spark.sparktrain.startTimeout in Spark conf"),
        ("env", "SPARKTRAIN_START_TIMEOUT"),
    ],
)
def test_parse_errors_name_the_key_and_where_it_came_from(source: str, where: str) -> None:
    spark_conf = {"spark.sparktrain.startTimeout": "soon"} if source == "spark" else {}
    environ = {"SPARKTRAIN_START_TIMEOUT": "soon"} if source == "env" else {}
    with pytest.raises(ConfigurationError) as info:
        RunConfig.resolve(1, spark_conf=spark_conf, environ=environ)
    message = str(info.value)
    assert message.startswith(where + ":")
    assert "'soon'" in message and "30s, 5m, 1h" in message


@pytest.mark.parametrize(
    "env_name, text, fragment",
    [
        ("SPARKTRAIN_MAX_PAYLOAD_BYTES", "lots", "not a size: 'lots'"),
        ("SPARKTRAIN_USE_GPU", "maybe", "not a boolean: 'maybe'"),
        ("SPARKTRAIN_RESTART_ON_USER_ERROR", "sometimes", "not a boolean: 'sometimes'"),
        ("SPARKTRAIN_MAX_RESTARTS", "1.5", "SPARKTRAIN_MAX_RESTARTS:"),
        ("SPARKTRAIN_TIMEOUT", "-3", "not a duration: '-3'"),
    ],
)
def test_env_parse_errors_name_the_variable(env_name: str, text: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig.resolve(1, environ={env_name: text})
    assert str(info.value).startswith(f"{env_name}: ")
    assert fragment in str(info.value)


def test_parsed_value_is_still_validated() -> None:
    with pytest.raises(ConfigurationError, match="start_timeout must be a positive number"):
        RunConfig.resolve(1, environ={"SPARKTRAIN_START_TIMEOUT": "0s"})
    config = RunConfig.resolve(1, spark_conf={"spark.sparktrain.backend": " tf "}, environ={})
    with pytest.raises(ConfigurationError, match="unknown backend 'tf'"):
        get_backend(config.backend)  # what SparkRunner.run() does with the session's conf


@pytest.mark.parametrize(
    "field, key, env",
    [
        ("start_timeout", "spark.sparktrain.startTimeout", "SPARKTRAIN_START_TIMEOUT"),
        (
            "driver_log_verbosity",
            "spark.sparktrain.driverLogVerbosity",
            "SPARKTRAIN_DRIVER_LOG_VERBOSITY",
        ),
        ("max_payload_bytes", "spark.sparktrain.maxPayloadBytes", "SPARKTRAIN_MAX_PAYLOAD_BYTES"),
        (
            "restart_on_user_error",
            "spark.sparktrain.restartOnUserError",
            "SPARKTRAIN_RESTART_ON_USER_ERROR",
        ),
    ],
)
def test_key_names(field: str, key: str, env: str) -> None:
    assert conf_key(field) == key
    assert env_key(field) == env


@pytest.mark.parametrize(
    "field, text, expected",
    [
        ("timeout", "none", None),
        ("timeout", "auto", None),
        ("timeout", "", None),
        ("timeout", "90", 90.0),
        ("use_gpu", "auto", None),
        ("use_gpu", "yes", True),
        ("use_gpu", "off", False),  # "off" is no value only where it is the unset word
        ("stall_timeout", "off", None),
        ("stall_timeout", "none", None),
        ("stall_timeout", "5m", 300.0),
        ("launcher", " ", None),
        ("launcher", "mpi", "mpi"),
    ],
)
def test_optional_fields_accept_none_words(field: str, text: str, expected: Any) -> None:
    config = RunConfig.resolve(1, environ={env_key(field): text})
    assert getattr(config, field) == expected


# --- text parsers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("120", 120.0),
        ("120s", 120.0),
        (" 1.5 s ", 1.5),
        (".5", 0.5),
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("2H", 7200.0),
        ("10MS", 0.01),
        ("3d", 259200.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "-1", "1w", "1e3", "5 minutes", "1.2.3", "ten"])
def test_parse_duration_errors(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration") as info:
        parse_duration(text)
    assert "30s, 5m, 1h" in str(info.value)


@pytest.mark.parametrize(
    "text, size",
    [
        ("0", 0),
        ("1048576", 1 << 20),
        ("64k", 64 << 10),
        ("64kb", 64 << 10),
        ("256m", 256 << 20),
        ("256MB", 256 << 20),
        ("1g", 1 << 30),
        ("2t", 2 << 40),
        (" 7 ", 7),
        ("12b", 12),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1.5m", "-1", "1p", "m", "64 kilobytes"])
def test_parse_size_errors(text: str) -> None:
    with pytest.raises(ValueError, match="not a size") as info:
        parse_size(text)
    assert "64k, 256m, 1g" in str(info.value)


@pytest.mark.parametrize(
    "text, value",
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        (" on ", True),
        ("false", False),
        ("0", False),
        ("No", False),
        ("off", False),
    ],
)
def test_parse_bool(text: str, value: bool) -> None:
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["", "y", "2", "enabled"])
def test_parse_bool_errors(text: str) -> None:
    with pytest.raises(ValueError, match="not a boolean"):
        parse_bool(text)


@pytest.mark.parametrize("seconds", [120.0, 60, 10.0, 0.5, 0.25, 1.5, 3600.0])
def test_format_duration_reads_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "size, text",
    [(256 << 20, "256m"), (1 << 30, "1g"), (64 << 10, "64k"), (1000, "1000"), (0, "0")],
)
def test_format_size_reads_back(size: int, text: str) -> None:
    assert format_size(size) == text and parse_size(text) == size


# --- defaults.conf: written from the field defaults, never edited by hand ----------------------


def test_shipped_defaults_conf_is_rendered_from_the_field_defaults() -> None:
    shipped = resources.files("sparktrain").joinpath("defaults.conf").read_text(encoding="utf-8")
    assert shipped == render_defaults_conf(), (
        "sparktrain/defaults.conf differs from RunConfig's field defaults; regenerate it with "
        "python -c \"import sparktrain.config as c; print(c.render_defaults_conf(), end='')\" "
        "> sparktrain/defaults.conf"
    )


def test_defaults_conf_reads_back_as_the_field_defaults() -> None:
    conf = parse_conf_text(render_defaults_conf())
    # np (with elastic, its (min, max)) and env are arguments only.
    keyword_only = ("np", "env", "elastic")
    settable = [f.name for f in dataclasses.fields(RunConfig) if f.name not in keyword_only]
    assert set(conf) == {conf_key(name) for name in settable}  # every setting, nothing else
    assert RunConfig.resolve(1, spark_conf=conf, environ={}) == RunConfig(np=1)
    # ... and through the environment too, which reads the same text forms.
    environ = {env_key(name): conf[conf_key(name)] for name in settable}
    assert RunConfig.resolve(1, environ=environ) == RunConfig(np=1)


def test_defaults_conf_names_every_backend() -> None:
    [line] = [line for line in render_defaults_conf().splitlines() if line.startswith("# backend")]
    assert all(name in line for name in backend_names())


def test_np_and_env_have_no_conf_key() -> None:
    for name in ("np", "env", "elastic"):
        with pytest.raises(KeyError):
            conf_key(name)


# --- JSON --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        RunConfig(np=1),
        RunConfig(
            np=-3,
            backend="horovod",
            driver_log_verbosity="log_callback_only",
            start_timeout=5.5,
            timeout=60,
            capacity_wait=1,
            grace_period=0.25,
            env={"A": "1", "PATHS": "a:b"},
            use_gpu=False,
            max_payload_bytes=1024,
            max_result_bytes=2048,
            max_restarts=2,
            restart_on_user_error=True,
            launcher="mpi",
        ),
    ],
    ids=["defaults", "every field set"],
)
def test_json_round_trip(config: RunConfig) -> None:
    data = json.loads(json.dumps(config.to_json()))  # really JSON-safe
    again = RunConfig.from_json(data)
    assert again == config
    assert dict(again.env) == dict(config.env)
    assert set(data) == {f.name for f in dataclasses.fields(RunConfig)}


def test_from_json_validates() -> None:
    data = RunConfig(np=2).to_json()
    data["env"] = {"RANK": "1"}
    with pytest.raises(ConfigurationError, match="env may not set RANK"):
        RunConfig.from_json(data)


# -- extra_mpi_args (horovod.spark.run's) and ignore_ssl ------------------------------------


@pytest.mark.parametrize(
    "given, expected",
    [
        ("-x NCCL_DEBUG=INFO --bind-to none", ("-x", "NCCL_DEBUG=INFO", "--bind-to", "none")),
        (["-x", "NCCL_SOCKET_IFNAME=^lo,docker0"], ("-x", "NCCL_SOCKET_IFNAME=^lo,docker0")),
        ("-mca btl_tcp_if_include eth0", ("-mca", "btl_tcp_if_include", "eth0")),
        ("", ()),
    ],
)
def test_extra_mpi_args_are_split_into_tokens(given: object, expected: tuple[str, ...]) -> None:
    config = RunConfig(np=2, backend="horovod", launcher="mpi", extra_mpi_args=given)  # type: ignore[arg-type]
    assert config.extra_mpi_args == expected


def test_extra_mpi_args_from_spark_conf_and_env() -> None:
    key = conf_key("extra_mpi_args")
    assert key == "spark.sparktrain.extraMpiArgs"
    config = RunConfig.resolve(
        2, {"backend": "horovod", "launcher": "mpi"}, spark_conf={key: "-x A=1"}
    )
    assert config.extra_mpi_args == ("-x", "A=1")
    config = RunConfig.resolve(
        2,
        {"backend": "horovod", "launcher": "mpi"},
        spark_conf={key: "-x A=1"},
        environ={"SPARKTRAIN_EXTRA_MPI_ARGS": "--bind-to none"},
    )
    assert config.extra_mpi_args == ("--bind-to", "none")
    assert RunConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize(
    "given, fragment",
    [
        ("-x A=1; rm -rf /", "shell syntax is refused"),
        ("-x A=$(id)", "shell syntax is refused"),
        (["-x", "A=1 B=2"], "shell syntax is refused"),  # a space inside one token
        ("-x 'A=1", "cannot split"),
        ("evil.sh -x A=1", "'evil.sh' is not a flag: mpirun would run it as the program"),
        ("-np 4", "-np is sparktrain's to set: the number of ranks"),
        ("--host a,b", "--host is sparktrain's to set: the hosts"),
        ("--map-by node", "--map-by is sparktrain's to set"),
        ("-mca plm_rsh_agent ssh", "-mca plm_rsh_agent is sparktrain's to set"),
        ([1, 2], "every argument must be a str"),
    ],
)
def test_bad_extra_mpi_args_are_refused_naming_the_token(given: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=2, backend="horovod", launcher="mpi", extra_mpi_args=given)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert "extra_mpi_args" in str(info.value)


@pytest.mark.parametrize("launcher", [None, "gloo"])
def test_extra_mpi_args_need_the_mpi_launcher(launcher: str | None) -> None:
    with pytest.raises(ConfigurationError, match="set launcher='mpi'"):
        RunConfig(np=2, backend="horovod", launcher=launcher, extra_mpi_args="-x A=1")


def test_ignore_ssl_is_a_bool_setting() -> None:
    assert RunConfig(np=2).ignore_ssl is False
    assert conf_key("ignore_ssl") == "spark.sparktrain.ignoreSsl"
    assert RunConfig.resolve(2, spark_conf={"spark.sparktrain.ignoreSsl": "true"}).ignore_ssl
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=2, ignore_ssl="yes")  # type: ignore[arg-type]
    assert str(info.value) == (
        "ignore_ssl must be True or False; got 'yes' "
        "(argument ignore_ssl=, or spark.sparktrain.ignoreSsl)"
    )
