"""The limits on a policy's regular expressions: they run against what any user controls
(comm, cmdline), so they must compile under limits and match in bounded time.

Pure. Called by the checker (``hostd.policy.check``) for the ``*_regex`` predicates.
"""

from __future__ import annotations

import re

try:  # the regular expression parser, for the limits (Python 3.11+; sre_parse before)
    from re import _parser as _sre_parser  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse as _sre_parser  # type: ignore[no-redef]

# Regular expressions in a policy run against what any user controls (comm, cmdline): they
# must compile under limits and match in bounded time. Python's engine backtracks, so a
# quantifier over something that can itself repeat or branch, "(a+)+$", "(a|aa)*", can take
# exponential time on a crafted cmdline: such patterns are refused, and what they see is cut
# to MATCH_CHARS (hostd.model.predicates).
MAX_REGEX_CHARS, MAX_REGEX_DEPTH, MAX_REPEAT_COUNT = 512, 16, 1000
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` may not be a policy's regular expression (None: it may)."""
    if len(pattern) > MAX_REGEX_CHARS:
        return f"is at most {MAX_REGEX_CHARS} characters long"
    depth = deepest = 0
    escaped = False
    for ch in pattern:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    if deepest > MAX_REGEX_DEPTH:
        return f"nests at most {MAX_REGEX_DEPTH} groups"
    try:
        tree = _sre_parser.parse(pattern)
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        return f"compiles ({exc})"
    return _repeat_problem(tree.data if hasattr(tree, "data") else tree, inside=False)


def _repeat_problem(items: object, inside: bool) -> str | None:
    for op, av in items:  # type: ignore[attr-defined]
        name = str(op)
        if name in _REPEATS:
            low, high, body = av
            if low > MAX_REPEAT_COUNT or (
                high != _sre_parser.MAXREPEAT and high > MAX_REPEAT_COUNT
            ):
                return f"repeats at most {MAX_REPEAT_COUNT} times"
            if high > 1:
                if inside:
                    return (
                        "has no quantifier over a repeating group such as (a+)+ "
                        "(it can take exponential time)"
                    )
                why = _repeat_problem(body.data, inside=True)
                if why:
                    return why
                continue
        if name == "BRANCH" and inside:
            return (
                "has no quantifier over alternatives such as (a|ab)* (it can take exponential time)"
            )
        for part in av if isinstance(av, (tuple, list)) else ():
            subs = part if isinstance(part, list) else [part]
            for sp in subs:
                if hasattr(sp, "data"):
                    why = _repeat_problem(sp.data, inside)
                    if why:
                        return why
    return None
