"""mkdocs hook: pages written from the code, so they cannot go stale.

``<!-- settings-table -->`` in a page becomes the table of every setting, read from
:class:`sparktrain.config.RunConfig`'s declarations (the source ``defaults.conf`` is written
from); ``<!-- public-api -->`` becomes one mkdocstrings entry per name of
``sparktrain.__all__``, in that order, and ``<!-- public-api sparktrain.WING -->`` one per
name of that public wing's ``__all__``. In the API reference, a runner's argument that is a
setting shows the setting's default (its signature says ``None``: "not given here", so
that the Spark conf and the environment can set it), linked to the Settings page.
"""

from __future__ import annotations

import html
import re
from typing import Any

SETTINGS_MARK = "<!-- settings-table -->"
API_MARK = "<!-- public-api -->"
# A public wing's reference: ``<!-- public-api sparktrain.checkpoint -->``.
WING_MARK = re.compile(r"<!-- public-api (sparktrain\.[a-z_]+) -->")


def _cell(text: str) -> str:
    """``text`` made safe for one cell of a Markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def _key(text: str) -> str:
    """A setting's name or key as inline code that never wraps mid-word (``.st-key`` in
    docs/stylesheets/extra.css: the theme breaks code anywhere to fit a narrow column)."""
    return f'<code class="st-key">{html.escape(text)}</code>'


def setting_defaults() -> dict[str, str]:
    """Each setting's built-in default as the Settings page writes it, by argument name."""
    from sparktrain.config import RunConfig
    from sparktrain.config.keys import KINDS, settings_of

    out = {}
    for field in settings_of(RunConfig):
        meta = field.metadata
        value = field.default
        default = meta["unset"] if value is None else KINDS[meta["kind"]][1](value)
        out[field.name] = default or "none"
    return out


def settings_table() -> str:
    """The Markdown table of every setting: its argument, Spark conf key and environment
    variable (one cell, one name a line), built-in default and meaning."""
    from sparktrain.config import RunConfig
    from sparktrain.config.keys import conf_key_of, env_key, settings_of

    defaults = setting_defaults()
    rows = [
        "| argument, Spark conf key, environment | default | meaning |",
        "|---|---|---|",
    ]
    for field in settings_of(RunConfig):
        names = (field.name, conf_key_of(RunConfig, field.name), env_key(field.name))
        rows.append(
            f"| {'<br>'.join(_key(name) for name in names)} | "
            f"{_cell(f'`{defaults[field.name]}`')} | {_cell(str(field.metadata['doc']))} |"
        )
    return "\n".join(rows) + "\n"


# The API reference's classes whose keyword arguments include settings.
RUNNERS = ("SparkRunner", "HorovodRunner")
# One row of mkdocstrings' parameter table whose default is None: its name, and the cell.
_NONE_ROW = re.compile(
    r'(<tr class="doc-section-item">\s*<td>\s*<code>(\w+)</code>(?:(?!</tr>).)*?)'
    r"<td>\s*<code>None</code>\s*</td>(\s*</tr>)",
    re.S,
)


def settings_defaults_in_api(page_html: str) -> str:
    """``page_html`` with the real default in place of ``None`` for every argument of a
    runner that is a setting."""
    defaults = setting_defaults()

    def cell(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in defaults:
            return match.group(0)
        link = '<a href="settings.html" title="the setting\'s default (see Settings)">'
        value = html.escape(defaults[name])
        return f"{match.group(1)}<td>{link}<code>{value}</code></a></td>{match.group(3)}"

    for runner in RUNNERS:
        start = page_html.find(f'id="sparktrain.{runner}"')
        if start < 0:
            continue
        after = re.compile(r'id="sparktrain\.[A-Za-z_]+"').search(page_html, start + 1)
        end = after.start() if after else len(page_html)
        page_html = page_html[:start] + _NONE_ROW.sub(cell, page_html[start:end]) + page_html[end:]
    return page_html


def public_api() -> str:
    """One mkdocstrings entry per public name, in ``sparktrain.__all__``'s order."""
    import sparktrain

    return "\n".join(f"::: sparktrain.{name}\n" for name in sparktrain.__all__)


def wing_api(module: str) -> str:
    """One mkdocstrings entry per name of a public wing's ``__all__``, in its order."""
    import importlib

    names = importlib.import_module(module).__all__
    return "\n".join(f"::: {module}.{name}\n" for name in names)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Fill the marks of a page with the text written from the code."""
    if SETTINGS_MARK in markdown:
        markdown = markdown.replace(SETTINGS_MARK, settings_table())
    if API_MARK in markdown:
        markdown = markdown.replace(API_MARK, public_api())
    return WING_MARK.sub(lambda match: wing_api(match.group(1)), markdown)


def on_page_content(content: str, page: Any, **_: Any) -> str:
    """Give the API reference's runner arguments that are settings their real defaults."""
    if page.file.src_uri == "api.md":
        return settings_defaults_in_api(content)
    return content
