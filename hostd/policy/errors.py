"""What a policy that cannot be used raises: ``PolicyError``, one line per error, and the
did-you-mean hint for a misspelled key, choice, predicate or role.

Pure. Raised by the checker (``hostd.policy.check``) and the loaders (``hostd.policy``); read
by the CLI, which prints ``str()`` as is.
"""

from __future__ import annotations

import difflib
import json
import re

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class _Nothing:
    def __repr__(self) -> str:
        return "<nothing>"


NOTHING: object = _Nothing()  # no value to show (a missing or an unknown key)


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def key_name(name: str) -> str:
    """A key as TOML would write it: bare when it can be, else quoted (keeps errors one line)."""
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


def did_you_mean(word: object, choices: tuple[str, ...] | list[str]) -> str:
    """The choices closest to a misspelled ``word`` ("" when none is close)."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)
    return " or ".join(f'"{c}"' for c in close)


class PolicyError(ValueError):
    """A policy that cannot be used. ``str()`` is the line shown to the user (one per error:
    ``errors`` lists them all, this one first): ``file:line:column: key.path: value: expected
    ... (did you mean ...?)``, the position where the key path is found in the file."""

    def __init__(
        self,
        source: str,
        key: str,
        value: object,
        expected: str,
        problem: str = "",
        *,
        position: tuple[int, int] | None = None,
        hint: str = "",
    ) -> None:
        self.source, self.key, self.value, self.expected = source, key, value, expected
        self.position = position
        self.errors: list[PolicyError] = [self]
        at = f"{source}:{position[0]}:{position[1]}" if position else source
        where = f"{at}: {key}" if key else at
        shown = "" if value is NOTHING else f": {show(value)}"
        problem = f": {problem};" if problem else ":"
        hint = f" (did you mean {hint}?)" if hint else ""
        super().__init__(f"{where}{shown}{problem} expected {expected}{hint}")

    @classmethod
    def about_file(cls, source: str, expected: str) -> PolicyError:
        """An error about the file as a whole (unreadable, untrusted), not one of its keys."""
        return cls(source, "", NOTHING, expected)

    @classmethod
    def all_of(cls, errors: list[PolicyError]) -> PolicyError:
        """Every error of a file at once: the first one, with ``errors`` and one line each."""
        first = errors[0]
        first.errors = list(errors)
        first.args = ("\n".join(str(e.args[0]) for e in errors),)
        return first
