"""The validators settings declare (sparktrain.config.validators): what each keeps, what each
refuses, and the refusal's words (the argument and the Spark conf key to change)."""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Any

import pytest

from sparktrain.config import RunConfig, conf_key
from sparktrain.config.checks import environment, world_size
from sparktrain.config.mpi_args import parse_mpi_args
from sparktrain.config.validators import (
    SECONDS,
    Arg,
    at_least,
    boolean,
    choice,
    duration,
    parsed,
    size,
    string,
)
from sparktrain.errors import ConfigurationError
from sparktrain.units import parse_names

ARG = Arg("wait", "spark.sparktrain.wait")
WHERE = " (argument wait=, or spark.sparktrain.wait)"


def refusal(validate: Any, value: Any, arg: Arg = ARG) -> str:
    """The text of the refusal of ``value``."""
    with pytest.raises(ConfigurationError) as info:
        validate(value, arg)
    return str(info.value)


def test_where_names_the_argument_and_conf_key_and_nothing_without_a_key() -> None:
    assert ARG.where() == WHERE
    assert ARG.where(" 5m") == " (argument wait=, or spark.sparktrain.wait 5m)"
    assert Arg("np").where() == ""


# --- choice -----------------------------------------------------------------------------------


def test_choice_keeps_a_listed_name() -> None:
    assert choice(("warn", "fail"))("fail", ARG) == "fail"


def test_choice_refuses_another_name_listing_the_names_and_where() -> None:
    assert refusal(choice(("warn", "fail")), "Warn") == (
        f"wait must be one of warn, fail; got 'Warn'{WHERE}"
    )


def test_choice_with_unset_keeps_none_and_lists_its_word() -> None:
    check = choice(("a", "b"), unset="auto")
    assert check(None, ARG) is None
    assert refusal(check, "auto") == f"wait must be one of a, b or auto; got 'auto'{WHERE}"


def test_choice_without_unset_refuses_none() -> None:
    assert refusal(choice(("a",)), None) == f"wait must be one of a; got None{WHERE}"


def test_choice_says_why_after_where() -> None:
    assert refusal(choice(("a",), why="a is all"), "b") == (
        f"wait must be one of a; got 'b'{WHERE}: a is all"
    )


# --- duration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, kept", [(90, 90), (1.5, 1.5), ("90s", 90.0), (" 10m ", 600.0), ("500ms", 0.5)]
)
def test_duration_keeps_seconds_and_reads_text(given: Any, kept: float) -> None:
    value = duration()(given, ARG)
    assert value == kept and type(value) is type(kept)


@pytest.mark.parametrize(
    "given, shown",
    [
        (0, "0"),
        ("0", "0.0"),
        (-1, "-1"),
        (math.inf, "inf"),
        (math.nan, "nan"),
        (True, "True"),
        (None, "None"),
        ("soon", "'soon'"),
        ("none", "'none'"),
    ],
)
def test_duration_refuses_what_is_not_a_positive_finite_time(given: Any, shown: str) -> None:
    assert refusal(duration(), given) == f"wait must be {SECONDS}; got {shown}{WHERE}"


@pytest.mark.parametrize("given", [None, "off", " OFF "])
def test_duration_with_unset_reads_its_word_and_none_as_none(given: Any) -> None:
    assert duration(unset="off")(given, ARG) is None


def test_duration_with_unset_refuses_other_words_saying_what_it_takes() -> None:
    check = duration(unset="off", what="seconds or 'off'")
    assert refusal(check, "none") == f"wait must be seconds or 'off'; got 'none'{WHERE}"


def test_duration_allows_zero_only_when_told() -> None:
    assert duration(zero=True)(0, ARG) == 0
    assert duration(zero=True)("0s", ARG) == 0.0
    assert refusal(duration(zero=True), -0.5) == f"wait must be {SECONDS}; got -0.5{WHERE}"
    assert refusal(duration(), 0.0) == f"wait must be {SECONDS}; got 0.0{WHERE}"


# --- size, at_least ---------------------------------------------------------------------------


@pytest.mark.parametrize("given, kept", [(1, 1), ("64k", 64 << 10), ("1g", 1 << 30)])
def test_size_keeps_bytes_and_reads_text(given: Any, kept: int) -> None:
    assert size()(given, ARG) == kept


@pytest.mark.parametrize(
    "given, shown", [(0, "0"), (-5, "-5"), (1.5, "1.5"), (True, "True"), ("lots", "'lots'")]
)
def test_size_refuses_what_is_not_a_positive_int(given: Any, shown: str) -> None:
    assert refusal(size(), given) == f"wait must be a positive int; got {shown}{WHERE}"


def test_at_least_keeps_the_minimum_and_above() -> None:
    assert [at_least(0)(n, ARG) for n in (0, 3)] == [0, 3]


@pytest.mark.parametrize("given, shown", [(-1, "-1"), (True, "True"), (1.0, "1.0"), ("2", "'2'")])
def test_at_least_refuses_below_and_non_ints(given: Any, shown: str) -> None:
    assert refusal(at_least(0), given) == f"wait must be an integer >= 0; got {shown}{WHERE}"


# --- boolean, string --------------------------------------------------------------------------


def test_boolean_keeps_true_and_false_and_refuses_the_rest() -> None:
    assert [boolean()(b, ARG) for b in (True, False)] == [True, False]
    assert refusal(boolean(), "false") == f"wait must be True or False; got 'false'{WHERE}"
    assert refusal(boolean(), None) == f"wait must be True or False; got None{WHERE}"
    assert refusal(boolean(), 1) == f"wait must be True or False; got 1{WHERE}"


def test_boolean_allowing_none_keeps_none_and_refuses_text() -> None:
    check = boolean(allow_none=True)
    assert [check(b, ARG) for b in (None, True, False)] == [None, True, False]
    assert refusal(check, "auto") == f"wait must be True, False or None; got 'auto'{WHERE}"


def test_string_keeps_text_as_given() -> None:
    assert string()(" torch ", ARG) == " torch "
    assert string(allow_none=True)(None, ARG) is None
    assert string(non_empty=True)("x", ARG) == "x"


@pytest.mark.parametrize(
    "check, value, said",
    [
        (string(), None, "a string; got None"),
        (string(), 3, "a string; got 3"),
        (string(allow_none=True), b"x", "a string or None; got b'x'"),
        (string(allow_none=True, non_empty=True), "  ", "a non-empty string or None; got '  '"),
    ],
)
def test_string_refusals_say_what_is_allowed(check: Any, value: Any, said: str) -> None:
    assert refusal(check, value) == f"wait must be {said}{WHERE}"


# --- parsed -----------------------------------------------------------------------------------


def test_parsed_keeps_what_the_reader_makes() -> None:
    check = parsed(parse_mpi_args)
    assert check("-x A=1 --bind-to none", ARG) == ("-x", "A=1", "--bind-to", "none")
    assert check(None, ARG) == ()


def test_parsed_none_if_empty_keeps_none_and_makes_empty_none() -> None:
    check = parsed(parse_names, none_if_empty=True)
    assert check(None, ARG) is None
    assert check(" , ", ARG) is None
    assert check("ib0, eth0", ARG) == ("ib0", "eth0")


def test_parsed_refuses_with_the_readers_words_the_hint_and_the_example() -> None:
    check = parsed(parse_names, hint="name them", example=" eth0")
    assert refusal(check, "a b") == (
        "wait: a name has a space in it: 'a b'; name them "
        "(argument wait=, or spark.sparktrain.wait eth0)"
    )
    assert refusal(parsed(parse_mpi_args), "'open") == (
        f'wait: cannot split "\'open" into arguments: No closing quotation{WHERE}'
    )


# --- the keyword-only arguments, and the declarations ------------------------------------------


def test_world_size_keeps_a_non_zero_int_and_refuses_zero() -> None:
    assert [world_size(n, Arg("np")) for n in (3, -2)] == [3, -2]
    assert refusal(world_size, 0, Arg("np")) == (
        "np must be a non-zero integer (np=N runs N ranks on Spark executors, np=-N runs N "
        "ranks on the driver); got 0"
    )


def test_environment_is_kept_read_only_and_refuses_a_rank_variable() -> None:
    env = environment({"A": "1"}, Arg("env"))
    assert isinstance(env, MappingProxyType) and dict(env) == {"A": "1"}
    assert refusal(environment, {"RANK": "1"}, Arg("env")) == (
        "env may not set RANK: sparktrain sets it for each rank"
    )


def test_every_setting_declares_its_check() -> None:
    names = [f.name for f in dataclasses.fields(RunConfig) if f.name != "elastic"]
    unchecked = [
        f.name
        for f in dataclasses.fields(RunConfig)
        if f.name != "elastic" and f.metadata.get("check") is None
    ]
    assert "warm_start" in names and unchecked == []


class _Odd:
    """A value no setting takes."""

    def __repr__(self) -> str:
        return "<odd>"


@pytest.mark.parametrize(
    "name", [f.name for f in dataclasses.fields(RunConfig) if "key" in f.metadata]
)
def test_every_refusal_names_the_argument_and_its_spark_conf_key(name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=2, **{name: _Odd()})
    message = str(info.value)
    # nics' example value follows its key: "(argument nics=, or spark.sparktrain.nics eth0,ib0)"
    assert message.startswith(name) and f" (argument {name}=, or {conf_key(name)}" in message


def test_a_declared_check_is_what_runconfig_applies() -> None:
    config = RunConfig(np=2, stall_timeout=" Off ", max_result_bytes="1m", nics="ib0,eth0")
    assert (config.stall_timeout, config.max_result_bytes, config.nics) == (
        None,
        1 << 20,
        ("ib0", "eth0"),
    )
    with pytest.raises(ConfigurationError) as info:
        RunConfig(np=2, stall_timeout="never")
    assert str(info.value) == (
        f"stall_timeout must be {SECONDS} or 'off'; got 'never' "
        "(argument stall_timeout=, or spark.sparktrain.stallTimeout)"
    )
