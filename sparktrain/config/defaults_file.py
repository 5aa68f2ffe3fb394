"""``sparktrain/defaults.conf``: every setting, its meaning and its built-in default, written
from :class:`~sparktrain.config.RunConfig`'s field defaults (the only source)."""

from __future__ import annotations

import textwrap

from sparktrain.config.keys import KINDS, env_key, settings_of
from sparktrain.config.settings import RunConfig, conf_key

_DEFAULTS_HEADER = """\
# Built-in defaults of sparktrain, written from the field defaults of sparktrain.config.RunConfig,
# which are the only source: change a default there, then regenerate this file from the
# repository's root with
# python -c "import sparktrain.config as c; print(c.render_defaults_conf(), end='')" > sparktrain/defaults.conf
#
# Every key can be overridden, in increasing precedence, by the Spark conf of the session (same
# key), by an environment variable (SPARKTRAIN_ + the argument's name in upper case, e.g.
# SPARKTRAIN_START_TIMEOUT), and by a keyword argument of SparkRunner (start_timeout=...).
# Durations are seconds (or 500ms, 30s, 5m, 1h, 3d); sizes are bytes (or 64k, 256m, 1g); none
# and auto mean no value, and so does off where it is the value shown. The format is Spark's:
# `key value` or `key=value`, # for comments.
"""


def render_defaults_conf() -> str:
    """The text of ``sparktrain/defaults.conf``: every setting, its meaning and its default."""
    parts = [_DEFAULTS_HEADER]
    for setting in settings_of(RunConfig):
        meta = setting.metadata
        about = f"{setting.name} ({env_key(setting.name)}): {meta['doc']}"
        value = setting.default
        text = meta["unset"] if value is None else KINDS[meta["kind"]][1](value)
        parts.append("\n" + textwrap.fill(about, 98, initial_indent="# ", subsequent_indent="# "))
        parts.append(f"\n{conf_key(setting.name):<40} {text}".rstrip() + "\n")
    return "".join(parts)
