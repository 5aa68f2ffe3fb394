"""The documentation site builds strictly (no broken link, anchor or missing page), offline,
from the pinned mkdocs tools, and its pages written from the code say what the code says."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sparktrain
from sparktrain.config import conf_keys

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("material", reason="mkdocs-material is not installed (the docs extra)")
pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python] is not installed")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site of this checkout, built strictly into a temporary folder."""
    site = tmp_path_factory.mktemp("site")
    proc = _build(ROOT / "mkdocs.yml", site)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return site


def test_every_page_is_built_with_navigation_and_search(site: Path) -> None:
    pages = sorted(p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md"))
    for page in pages:
        html = (site / page.with_suffix(".html")).read_text(encoding="utf-8")
        assert 'class="md-nav' in html, page
        assert 'data-md-component="search' in html, page
    assert (site / "search" / "search_index.json").stat().st_size > 10_000


def test_the_settings_page_lists_every_setting_from_the_code(site: Path) -> None:
    html = (site / "settings.html").read_text(encoding="utf-8")
    missing = [key for key in conf_keys() if f'<code class="st-key">{key}</code>' not in html]
    assert missing == []
    assert '<code class="st-key">SPARKTRAIN_START_TIMEOUT</code>' in html


def test_the_settings_keys_never_wrap_mid_word(site: Path) -> None:
    """The theme breaks inline code anywhere to fit a column ("spark.spark / train.backe /
    nd"); the settings' names, keys and variables are styled to break nowhere."""
    html = (site / "settings.html").read_text(encoding="utf-8")
    assert 'href="stylesheets/extra.css"' in html
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    rule = re.search(r"\.md-typeset code\.st-key\s*\{([^}]*)\}", css)
    assert rule is not None
    assert "white-space: nowrap" in rule.group(1) and "word-break: normal" in rule.group(1)
    keys = re.findall(r'<code class="st-key">([^<]*)</code>', html)
    assert len(keys) == 3 * len(conf_keys())  # argument, conf key, environment variable


def test_the_api_reference_shows_the_settings_real_defaults(site: Path) -> None:
    """A runner's setting argument is None in the signature ("not given"): the reference
    shows the default it then has, as the Settings page does, not "None"."""
    html = (site / "api.html").read_text(encoding="utf-8")
    runner = html[
        html.index('id="sparktrain.SparkRunner"') : html.index('id="sparktrain.SparkTrainError"')
    ]
    rows = {
        m.group(1): re.sub(r"\s+", " ", m.group(2)).strip()
        for m in re.finditer(
            r'<tr class="doc-section-item">\s*<td>\s*<code>(\w+)</code>(?:(?!</tr>).)*<td>((?:(?!<td>).)*?)</td>\s*</tr>',
            runner,
            re.S,
        )
    }
    setting = (
        '<a href="settings.html" title="the setting\'s default (see Settings)"><code>{}</code></a>'
    )
    assert rows["start_timeout"] == setting.format("120s")
    assert rows["backend"] == setting.format("torch")
    assert rows["timeout"] == setting.format("none")
    assert rows["spark"] == "<code>None</code>"  # not a setting: None is its real default


def test_the_api_reference_documents_every_public_name(site: Path) -> None:
    html = (site / "api.html").read_text(encoding="utf-8")
    missing = [name for name in sparktrain.__all__ if f'id="sparktrain.{name}"' not in html]
    assert missing == []
    for wing in sparktrain._PUBLIC_WINGS:
        module = importlib.import_module(f"sparktrain.{wing}")
        page = (site / "api" / f"{wing}.html").read_text(encoding="utf-8")
        missing = [n for n in module.__all__ if f'id="sparktrain.{wing}.{n}"' not in page]
        assert missing == [], f"sparktrain.{wing}"


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The strict build is what catches a page linking to one that is not there."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the guide](guide/missing.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        "site_name: t\nstrict: true\ntheme:\n  name: material\n"
        "validation:\n  unrecognized_links: warn\n  anchors: warn\n"
    )
    proc = _build(config, tmp_path / "site")
    assert proc.returncode != 0
    assert "guide/missing.md" in proc.stderr
