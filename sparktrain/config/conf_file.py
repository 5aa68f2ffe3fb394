"""The one reader of Spark-style conf files (``spark-defaults.conf``, ``defaults.conf``).

Spark reads ``spark-defaults.conf`` with ``java.util.Properties.load`` and trims each value,
so this accepts what Spark accepts:

- ``key value``, ``key=value``, ``key = value`` and ``key:value``: the key ends at the first
  space, tab, ``=`` or ``:`` that is not escaped, and one ``=`` or ``:`` after it (with the
  blanks around it) is the separator; ``=`` and ``:`` later in the value are kept;
- ``#`` or ``!`` as the first non-blank character makes a comment line;
- a line that ends in an odd number of backslashes continues on the next line (whose
  leading blanks are dropped);
- escapes ``\\t \\n \\r \\f \\uXXXX``; any other escaped character stands for itself
  (``\\=`` for a literal ``=`` in a key, ``\\\\`` for one backslash);
- a key given twice keeps its last value; values are trimmed as Spark trims them.
"""

from __future__ import annotations

import re
from pathlib import Path

_BLANKS = " \t\f"
_SEPARATORS = "=:"
_NATURAL_LINES = re.compile(r"\r\n|\r|\n")
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|u|.)", re.DOTALL)
_ESCAPED = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
# Spark's Utils.trimExceptCRLF: control characters and spaces, but not \r or \n.
_TRIMMED = "".join(chr(code) for code in range(33) if chr(code) not in "\r\n")


def parse_conf_text(text: str) -> dict[str, str]:
    """Parse the text of a Spark conf file into its settings.

    Args:
        text: the file's contents.

    Returns:
        Each key and its value, in file order (a repeated key keeps its last value).

    Raises:
        ValueError: for a malformed ``\\uXXXX`` escape, as Java's parser does.

    Example:
        >>> parse_conf_text("# comment\\nspark.a  1\\nspark.b=x=y\\nspark.c : 2s\\n")
        {'spark.a': '1', 'spark.b': 'x=y', 'spark.c': '2s'}
    """
    out: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split(line)
        out[_unescape(key)] = _unescape(value).strip(_TRIMMED)
    return out


def read_conf_file(path: str | Path) -> dict[str, str]:
    """Parse a Spark conf file (UTF-8, as Spark reads it); see :func:`parse_conf_text`.

    Raises:
        OSError: when the file cannot be read.
        ValueError: for a malformed ``\\uXXXX`` escape.
    """
    return parse_conf_text(Path(path).read_text(encoding="utf-8"))


def _logical_lines(text: str) -> list[str]:
    """Join continued lines; drop blank and comment lines."""
    lines: list[str] = []
    pending: str | None = None
    for natural in _NATURAL_LINES.split(text):
        line = natural.lstrip(_BLANKS)
        if pending is None and (not line or line[0] in "#!"):
            continue  # a comment line is never continued, even when it ends in a backslash
        backslashes = len(line) - len(line.rstrip("\\"))
        if backslashes % 2:
            pending = (pending or "") + line[:-1]
            continue
        lines.append((pending or "") + line)
        pending = None
    if pending is not None:  # a continuation at the end of the text ends the line
        lines.append(pending)
    return lines


def _split(line: str) -> tuple[str, str]:
    """(key, value) of a logical line, both still escaped."""
    end = 0
    while end < len(line):
        char = line[end]
        if char == "\\":
            end += 2
            continue
        if char in _BLANKS or char in _SEPARATORS:
            break
        end += 1
    rest = line[end:].lstrip(_BLANKS)
    if rest[:1] and rest[0] in _SEPARATORS:
        rest = rest[1:].lstrip(_BLANKS)
    return line[:end], rest


def _unescape(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        code = match.group(1)
        if code == "u":
            raise ValueError(f"malformed \\uxxxx escape in {text!r}")
        if len(code) == 5:
            return chr(int(code[1:], 16))
        return _ESCAPED.get(code, code)

    return _ESCAPE.sub(replace, text)
