"""sparktrain.checkpoint.layout: file names and the newest committed marker (pure, no torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparktrain.checkpoint import layout

_DCP = "step-000000000004.aa.dcp"
_ENTRY = {"size": 1, "sha256": "cd"}
_FILES = {".metadata": _ENTRY, "__0_0.distcp": _ENTRY}


def marker(step: int, data: str, **extra: object) -> bytes:
    return json.dumps({"step": step, "data": data, "size": 3, "sha256": "ab", **extra}).encode()


def test_names_round_trip() -> None:
    data = layout.data_name(7, "00ff")
    assert data == "step-000000000007.00ff.pt"
    assert layout.marker_name(7) == "step-000000000007.commit.json"
    assert layout.marker_step(layout.marker_name(7)) == 7
    assert layout.data_step(data) == 7 and layout.written_step(data) == 7
    partial = layout.partial_name(data, "0badf00d")
    assert partial == ".step-000000000007.00ff.pt.0badf00d.partial"
    assert layout.is_partial(partial) and layout.written_step(partial) == 7
    assert layout.data_step(partial) is None and layout.marker_step(data) is None
    for other in ["sparktrain-owner.json", "step-1.commit.json.bak", "step-000000000007.XY.pt"]:
        assert layout.marker_step(other) is None and layout.written_step(other) is None


def test_committed_is_newest_first() -> None:
    names = [layout.marker_name(s) for s in (2, 10, 1)] + [layout.data_name(11, "aa")]
    assert layout.committed(names) == [
        (10, layout.marker_name(10)),
        (2, layout.marker_name(2)),
        (1, layout.marker_name(1)),
    ]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"{not json", ValueError),
        (b"\xff\xfe", ValueError),
        (marker(4, layout.data_name(3, "aa")), layout.MalformedMarker),  # another step's data
        (marker(3, layout.data_name(4, "aa")), layout.MalformedMarker),  # records another step
        (marker(4, "../elsewhere.pt"), layout.MalformedMarker),
        (marker(4, layout.data_name(4, "aa"), size="3"), layout.MalformedMarker),
        (b"[]", layout.MalformedMarker),
        # sharded: the flag, the folder's name and a list of plain file names go together
        (marker(4, layout.data_name(4, "aa", sharded=True)), layout.MalformedMarker),
        (marker(4, layout.data_name(4, "aa"), sharded=True, files=_FILES), layout.MalformedMarker),
        (marker(4, _DCP, sharded=True, files={}), layout.MalformedMarker),
        (marker(4, _DCP, sharded=True, files={"../x": _ENTRY}), layout.MalformedMarker),
        (marker(4, _DCP, sharded=True, files={"a/b": _ENTRY}), layout.MalformedMarker),
        (marker(4, _DCP, sharded=True, files={"..": _ENTRY}), layout.MalformedMarker),
        (marker(4, _DCP, sharded=True, files={"x": {"size": "1"}}), layout.MalformedMarker),
    ],
)
def test_parse_marker_rejects(raw: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        layout.parse_marker(raw, 4)


def test_parse_marker() -> None:
    data = layout.data_name(4, "aa")
    assert layout.parse_marker(marker(4, data), 4) == layout.Marker(4, data, 3, "ab")
    assert not layout.is_sharded(data)


def test_parse_sharded_marker() -> None:
    assert layout.data_name(4, "aa", sharded=True) == _DCP and layout.is_sharded(_DCP)
    assert layout.data_step(_DCP) == 4 and layout.written_step(_DCP) == 4
    parsed = layout.parse_marker(marker(4, _DCP, sharded=True, files=_FILES), 4)
    assert parsed.files == {".metadata": (1, "cd"), "__0_0.distcp": (1, "cd")}


def test_newest_committed_skips_unusable_markers() -> None:
    files = {
        layout.marker_name(5): marker(5, layout.data_name(5, "55")),  # its data is not listed
        layout.marker_name(4): b"{broken",
        layout.marker_name(3): marker(3, layout.data_name(3, "33")),
        layout.data_name(3, "33"): b"...",
        layout.marker_name(2): marker(2, layout.data_name(2, "22")),
        layout.data_name(2, "22"): b"...",
    }
    names = [*files, layout.marker_name(6)]  # listed, but gone when read

    def read(name: str) -> bytes:
        if name not in files:
            raise FileNotFoundError(name)
        return files[name]

    assert layout.newest_committed(iter(names), read) == (
        layout.marker_name(3),
        layout.data_name(3, "33"),
    )
    assert layout.newest_committed([layout.data_name(3, "33")], read) is None


def test_importing_it_imports_no_torch() -> None:
    # The driver's MLflow tracking uses it; torch is for ranks only.
    code = (
        "import sys, sparktrain.checkpoint.layout, sparktrain.driver.tracking; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
