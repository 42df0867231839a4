"""Setting a few options in a TOML config file's text, keeping everything else byte for byte
(there is no TOML writer among syncd's dependencies; ``tomllib`` only reads).

Rules:
  * Only ``key = value`` lines of bare keys under a ``[section]`` header are edited: an option
    already there has its whole statement replaced (a multi-line array too: the statement ends
    at the first line after which it parses); one that is not is added after the section's
    last statement; a missing section is added at the end. Every other line — comments,
    blank lines, other keys, other sections — is kept as it was.
  * Every edit is verified: the new text must parse to exactly the old document with the new
    values in place. When it does not (a dotted key, an inline table, an option spelled with
    quotes), ``EditError`` says which options to write by hand, and nothing is returned to
    write.
  * Pure: text in, text out; the caller reads and writes files.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Mapping
from typing import Any

Option = tuple[str, str]  # (section, key)
_HEADER = re.compile(r"[ \t]*\[\[?[^\[\]]*\]\]?[ \t]*(#.*)?")
_ANY_HEADER = re.compile(r"[ \t]*\[")


class EditError(ValueError):
    pass


def toml_value(value: str | list[str]) -> str:
    """A string or a list of strings as TOML (JSON's string escapes are TOML's basic string's)."""
    if isinstance(value, str):
        return json.dumps(value)
    return "[" + ", ".join(json.dumps(item) for item in value) + "]"


def set_options(text: str, values: Mapping[Option, str | list[str]]) -> str:
    """``text`` with each ``(section, key)`` of ``values`` set (module rules)."""
    want = copy.deepcopy(tomllib.loads(text))
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    for (section, key), value in values.items():
        want.setdefault(section, {})[key] = value
        lines = _set(lines, section, key, f"{key} = {toml_value(value)}\n")
    result = "".join(lines)
    try:
        got = tomllib.loads(result)
    except tomllib.TOMLDecodeError:
        got = None
    if got != want:
        by_hand = "; ".join(f"[{s}] {k} = {toml_value(v)}" for (s, k), v in values.items())
        raise EditError(f"cannot set these options safely in this file's layout; write them "
                        f"by hand: {by_hand}")
    return result


def _set(lines: list[str], section: str, key: str, statement: str) -> list[str]:
    span = _section(lines, section)
    if span is None:
        gap = ["\n"] if lines and lines[-1].strip() else []
        return [*lines, *gap, f"[{section}]\n", statement]
    start, end = span
    found = re.compile(rf"[ \t]*{re.escape(key)}[ \t]*=")
    for i in range(start + 1, end):
        if found.match(lines[i]):
            j = _statement_end(lines, i, end, key)
            return [*lines[:i], statement, *lines[j:]]
    last = max((i for i in range(start, end) if i == start or (
        lines[i].strip() and not lines[i].lstrip().startswith("#"))), default=start)
    return [*lines[:last + 1], statement, *lines[last + 1:]]


def _section(lines: list[str], section: str) -> tuple[int, int] | None:
    """``[header line, next header line)`` of ``[section]``, or None."""
    mine = re.compile(rf"[ \t]*\[[ \t]*{re.escape(section)}[ \t]*\][ \t]*(#.*)?\n?")
    for i, line in enumerate(lines):
        if mine.fullmatch(line):
            end = next((j for j in range(i + 1, len(lines)) if _ANY_HEADER.match(lines[j])
                        and _HEADER.fullmatch(lines[j].rstrip("\n"))), len(lines))
            return i, end
    return None


def _statement_end(lines: list[str], start: int, limit: int, key: str) -> int:
    """The line after ``key = …`` that starts at ``start`` (a value may span lines)."""
    for j in range(start + 1, limit + 1):
        try:
            if key in tomllib.loads("".join(lines[start:j])):
                return j
        except tomllib.TOMLDecodeError:
            continue
    return start + 1  # unparseable: the verification refuses the result


def get_option(document: Mapping[str, Any], option: Option) -> Any:
    section = document.get(option[0])
    return section.get(option[1]) if isinstance(section, dict) else None
