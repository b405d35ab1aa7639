"""Where a key path of a policy error sits in the policy's text: line and column, for
``file:line:column: key.path: ...`` (tomllib gives values, not positions).

Pure. ``position(text, "layer[2].match[0][1].job_role")`` finds the third ``[[layer]]`` table,
its ``match`` key, the first AND-group's second element and, in it, the key ``job_role``; a
segment it cannot find leaves the deepest one it found (a missing required key: its table).
Handles what policies hold: tables, arrays of tables, dotted and quoted keys, inline tables
and arrays, strings of the four kinds and comments; it is no TOML parser and never raises.
"""

from __future__ import annotations

import re

_SEGMENT = re.compile(r'([A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*")|\[(\d+)\]')
_HEADER = re.compile(
    r"""^[ \t]*(\[\[?)[ \t]*([A-Za-z0-9_.\-"' ]+?)[ \t]*\]\]?[ \t]*(?:#.*)?$""", re.MULTILINE
)


def _segments(path: str) -> list[str | int]:
    out: list[str | int] = []
    for name, index in _SEGMENT.findall(path):
        out.append(int(index) if index else name.strip('"'))
    return out


def _skip_string(text: str, i: int) -> int:
    """The index just past the string that starts at ``i``."""
    for quote in ('"""', "'''", '"', "'"):
        if text.startswith(quote, i):
            j = i + len(quote)
            while j < len(text):
                if quote[0] == '"' and text[j] == "\\":
                    j += 2
                    continue
                if text.startswith(quote, j):
                    return j + len(quote)
                if len(quote) == 1 and text[j] == "\n":
                    return j
                j += 1
            return j
    return i + 1


def _skip_blank(text: str, i: int, end: int) -> int:
    while i < end:
        if text[i] in " \t\r\n,":
            i += 1
        elif text[i] == "#":
            nl = text.find("\n", i)
            i = end if nl < 0 else nl + 1
        else:
            break
    return i


def _value_end(text: str, i: int, end: int) -> int:
    """The end of the value that starts at ``i`` (an array, inline table, string or scalar)."""
    depth = 0
    while i < end:
        ch = text[i]
        if ch in "\"'":
            i = _skip_string(text, i)
            continue
        if ch == "#":
            nl = text.find("\n", i)
            i = end if nl < 0 else nl
            continue
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            if depth == 0:
                return i
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0 and ch in ",\n":
            return i
        i += 1
    return i


def _element(text: str, start: int, end: int, index: int) -> tuple[int, int] | None:
    """The span of element ``index`` of the array whose value starts at ``start``."""
    i = _skip_blank(text, start, end)
    if i >= end or text[i] != "[":
        return None
    i += 1
    for n in range(index + 1):
        i = _skip_blank(text, i, end)
        if i >= end or text[i] == "]":
            return None
        stop = _value_end(text, i, end)
        if n == index:
            return i, stop
        i = stop
    return None


def _key(text: str, name: str, start: int, end: int) -> tuple[int, int] | None:
    """(where the key ``name`` starts, where its value starts) in ``text[start:end]``."""
    quoted = f"\"{re.escape(name)}\"|'{re.escape(name)}'"
    key = f"{re.escape(name)}|{quoted}" if re.fullmatch(r"[A-Za-z0-9_-]+", name) else quoted
    pattern = re.compile(rf"(?:^|[\s{{,.])({key})[ \t]*(?:=|\.)", re.MULTILINE)
    i = start
    while True:
        m = pattern.search(text, i, end)
        if m is None:
            return None
        if not _in_string_or_comment(text, start, m.start(1)):
            eq = text.find("=", m.end(1), end)
            return m.start(1), (eq + 1 if eq >= 0 else m.end())
        i = m.end(1)


def _in_string_or_comment(text: str, start: int, pos: int) -> bool:
    i = start
    while i < pos:
        ch = text[i]
        if ch in "\"'":
            j = _skip_string(text, i)
            if j > pos:
                return True
            i = j
        elif ch == "#":
            nl = text.find("\n", i)
            if nl < 0 or nl > pos:
                return True
            i = nl + 1
        else:
            i += 1
    return False


def _table(text: str, name: str, index: int | None) -> tuple[int, int] | None:
    """The span of table ``[name]``, or of array-of-tables entry ``[[name]]`` number ``index``."""
    headers = list(_HEADER.finditer(text))
    seen = -1
    for n, m in enumerate(headers):
        if m.group(2).strip() != name or (m.group(1) == "[[") != (index is not None):
            continue
        seen += 1
        if index is None or seen == index:
            end = headers[n + 1].start() if n + 1 < len(headers) else len(text)
            return m.start(2), end
    return None


def position(text: str, path: str) -> tuple[int, int] | None:
    """(line, column), both from 1, of the deepest part of ``path`` found in ``text``."""
    segs = _segments(path)
    if not segs:
        return None
    found: int | None = None
    # the first header: [name] / [[name]] (an index after it), else a top-level key
    first = segs[0]
    index = segs[1] if len(segs) > 1 and isinstance(segs[1], int) else None
    span = _table(text, str(first), index) if isinstance(first, str) else None
    first_headers = _HEADER.search(text)
    top_end = first_headers.start() if first_headers else len(text)
    if span is not None:
        found, (start, end), rest = span[0], span, segs[2 if index is not None else 1 :]
        start = text.find("\n", start)
        start = end if start < 0 else start
    else:
        start, end, rest = 0, top_end, segs
    value: int | None = None
    for seg in rest:
        if isinstance(seg, int):
            if value is None:
                break
            element = _element(text, value, end, seg)
            if element is None:
                break
            found, (start, end), value = element[0], element, element[0]
        else:
            got = _key(text, seg, start, end)
            if got is None:
                break
            found, value = got
            start = value
            end = _value_end(text, _skip_blank(text, value, end), end) if value < end else end
    if found is None:
        return None
    line = text.count("\n", 0, found) + 1
    return line, found - (text.rfind("\n", 0, found) + 1) + 1
