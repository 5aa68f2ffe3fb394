"""mkdocs hook: pages written from the code, so they cannot go stale.

``<!-- settings-table -->`` in a page becomes the table of every setting, read from
:class:`sparktrain.config.RunConfig`'s declarations (the source ``defaults.conf`` is written
from); ``<!-- public-api -->`` becomes one mkdocstrings entry per name of
``sparktrain.__all__``, in that order.
"""

from __future__ import annotations

from typing import Any

SETTINGS_MARK = "<!-- settings-table -->"
API_MARK = "<!-- public-api -->"


def _cell(text: str) -> str:
    """``text`` made safe for one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def settings_table() -> str:
    """The Markdown table of every setting: argument, Spark conf key, environment variable,
    built-in default and meaning."""
    from sparktrain.config import RunConfig
    from sparktrain.config.keys import KINDS, conf_key_of, env_key, settings_of

    rows = [
        "| argument | Spark conf key | environment | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for field in settings_of(RunConfig):
        meta = field.metadata
        value = field.default
        default = meta["unset"] if value is None else KINDS[meta["kind"]][1](value)
        rows.append(
            f"| `{field.name}` | `{conf_key_of(RunConfig, field.name)}` | "
            f"`{env_key(field.name)}` | {_cell(f'`{default}`' if default else 'none')} | "
            f"{_cell(str(meta['doc']))} |"
        )
    return "\n".join(rows) + "\n"


def public_api() -> str:
    """One mkdocstrings entry per public name, in ``sparktrain.__all__``'s order."""
    import sparktrain

    return "\n".join(f"::: sparktrain.{name}\n" for name in sparktrain.__all__)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Fill the marks of a page with the text written from the code."""
    if SETTINGS_MARK in markdown:
        markdown = markdown.replace(SETTINGS_MARK, settings_table())
    if API_MARK in markdown:
        markdown = markdown.replace(API_MARK, public_api())
    return markdown
