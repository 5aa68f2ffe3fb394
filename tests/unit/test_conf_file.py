"""The one conf-file parser: what Spark (java.util.Properties, values trimmed) accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparktrain.config.conf_file import parse_conf_text, read_conf_file

ROOT = Path(__file__).resolve().parents[2]

# text -> settings, as Spark's Utils.getPropertiesFromFile reads them
CASES = {
    "blank separated": ("spark.a    1\n", {"spark.a": "1"}),
    "tab separated": ("spark.a\t1\n", {"spark.a": "1"}),
    "equals": ("spark.a=1\n", {"spark.a": "1"}),
    "equals with blanks": ("spark.a  =  1\n", {"spark.a": "1"}),
    "colon": ("spark.a: 1\n", {"spark.a": "1"}),
    "only the first separator splits": ("spark.a=b=c\n", {"spark.a": "b=c"}),
    "blank then '=' in the value": ("spark.a x=y\n", {"spark.a": "x=y"}),
    "java options": (
        "spark.driver.extraJavaOptions  -Dlog=file:/c/log4j2.properties -Dx=1\n",
        {"spark.driver.extraJavaOptions": "-Dlog=file:/c/log4j2.properties -Dx=1"},
    ),
    "key alone": ("spark.a\n", {"spark.a": ""}),
    "key and separator alone": ("spark.a =\n", {"spark.a": ""}),
    "comments and blank lines": (
        "# one\n  ! two\n\n   \nspark.a 1 # not a comment\n",
        {"spark.a": "1 # not a comment"},
    ),
    "indented": ("   spark.a 1\n", {"spark.a": "1"}),
    "value trimmed": ("spark.a   1 2  \t\n", {"spark.a": "1 2"}),
    "last one wins": ("spark.a 1\nspark.a=2\n", {"spark.a": "2"}),
    "continued line": ("spark.a 1,\\\n    2,\\\n 3\n", {"spark.a": "1,2,3"}),
    "even backslashes do not continue": (
        "spark.a x\\\\\nspark.b 2\n",
        {"spark.a": "x\\", "spark.b": "2"},
    ),
    "comment lines are not continued": ("# x \\\nspark.a 1\n", {"spark.a": "1"}),
    "continuation at the end": ("spark.a 1\\", {"spark.a": "1"}),
    "escapes": ("spark.a \\t\\u0041\\=\\:\\\\x\n", {"spark.a": "A=:\\x"}),
    "escaped separator in the key": ("spark\\=a\\ b = 1\n", {"spark=a b": "1"}),
    "crlf and cr": (
        "spark.a 1\r\nspark.b 2\rspark.c 3",
        {"spark.a": "1", "spark.b": "2", "spark.c": "3"},
    ),
    "empty": ("", {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_parse_conf_text_accepts_what_spark_accepts(name: str) -> None:
    text, expected = CASES[name]
    assert parse_conf_text(text) == expected


def test_malformed_unicode_escape_is_refused() -> None:
    with pytest.raises(ValueError, match="malformed"):
        parse_conf_text("spark.a \\u12\n")


def test_read_conf_file(tmp_path: Path) -> None:
    path = tmp_path / "spark-defaults.conf"
    path.write_text("spark.a  é\nspark.b=2\n", encoding="utf-8")
    assert read_conf_file(path) == {"spark.a": "é", "spark.b": "2"}
    assert read_conf_file(str(path)) == {"spark.a": "é", "spark.b": "2"}


def test_the_test_clusters_conf_parses() -> None:
    conf = read_conf_file(ROOT / "conf" / "spark-defaults.conf")
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.executor.extraJavaOptions"] == (
        "-Dlog4j2.configurationFile=file:{conf}/log4j2.properties"
    )
