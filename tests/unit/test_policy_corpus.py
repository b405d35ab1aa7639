"""The corpus of malformed policies in tests/fixtures/policies/bad/.

Every file there must be refused by ``load_policy`` with a one-line ``PolicyError`` that starts
with the file's path and, for an error about a key, the line and column of that key in the file
(``file:line:column: key.path: ...``), and names the key path and the problem listed for it in
``expected.toml`` (each file has one error; a file with several is reported whole: below);
``hostd policy check FILE`` must turn the same error into exit status 2 and that one line on
stderr, never a traceback. Entries of ``expected.toml`` with an ``xfail`` reason are known hostd
bugs: their tests are strict xfails, so they flip to failures once the bug is fixed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hostd.policy import PREDICATES, PolicyError, load_policy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "fixtures" / "policies" / "bad"
GOOD = REPO / "tests" / "fixtures" / "policies" / "good"
EXPECTED: dict[str, dict[str, str]] = tomllib.loads((BAD / "expected.toml").read_text())
CORPUS = sorted(p.name for p in BAD.glob("*.toml") if p.name != "expected.toml")
# The console script beside this interpreter: the same with or without an activated venv.
_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else shutil.which("hostd")
needs_cli = pytest.mark.skipif(
    HOSTD is None, reason="the hostd console script is not installed (pip install -e .)"
)


def _params() -> list:
    out = []
    for name in CORPUS:
        entry = EXPECTED.get(name, {})
        marks = [pytest.mark.xfail(strict=True, reason=entry["xfail"])] if "xfail" in entry else []
        out.append(pytest.param(name, marks=marks, id=name.removesuffix(".toml")))
    return out


def _error(path: Path) -> str:
    """The first line of the message ``load_policy`` refuses ``path`` with (its first error)."""
    return _errors(path)[0]


def _errors(path: Path) -> list[str]:
    """Every line of the message ``load_policy`` refuses ``path`` with: one per error."""
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    lines = str(info.value).split("\n")
    assert len(lines) == len(info.value.errors)
    return lines


def _check_message(message: str, path: Path, entry: dict[str, str]) -> None:
    assert "\n" not in message and "\r" not in message, f"not one line: {message!r}"
    at = re.match(rf"{re.escape(str(path))}(?::(\d+):(\d+))?: ", message)
    assert at, message
    rest = message[at.end() :]
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_-]*", entry["key"])
    text = path.read_text(errors="replace")
    if names and re.search(rf"^\s*\[*\s*{re.escape(names[0])}\b", text, re.MULTILINE):
        # a key the file holds: its line and column, on a line that names part of its path
        assert at.group(1), f"no line and column: {message}"
        line = text.splitlines()[int(at.group(1)) - 1]
        assert any(n in line for n in names), (message, line)
        assert 1 <= int(at.group(2)) <= len(line), (message, line)
        # "<key>: <value>: expected ..." or "<key>: expected ..."; the key may come quoted.
        named = rest.partition(": ")[0]
        assert named.strip("'\"") == entry["key"], message
    assert entry["fragment"] in message, message


# -- the corpus itself ------------------------------------------------------------------------
def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 30


def test_every_file_is_listed_in_expected() -> None:
    assert sorted(set(CORPUS) - set(EXPECTED)) == []


def test_every_expected_entry_has_a_file() -> None:
    assert sorted(set(EXPECTED) - set(CORPUS)) == []


def test_expected_entries_are_well_formed() -> None:
    for name, entry in EXPECTED.items():
        assert set(entry) <= {"key", "fragment", "xfail"}, name
        assert isinstance(entry["key"], str), name
        assert isinstance(entry["fragment"], str) and entry["fragment"], name


# -- the library --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", _params())
def test_load_policy_refuses_with_one_line(name: str) -> None:
    path = BAD / name
    first, *more = _errors(path)
    _check_message(first, path, EXPECTED[name])
    for line in more:  # every other error of the file: its own line, with its position
        assert re.match(rf"{re.escape(str(path))}:\d+:\d+: ", line), line


def test_every_error_of_a_file_at_once_with_positions_and_hints(tmp_path: Path) -> None:
    path = tmp_path / "many.toml"
    path.write_text(
        "version = 1\n"
        "[agent]\n"
        'mode = "enforced"\n'
        "[[layer]]\n"
        'name = "fast"\n'
        'coment = "typo"\n'
        'match = [[{ comm_prefx = "pt_" }], [{ job_role = "ranks" }]]\n'
        'kind = "grouped"\n'
        "cpus = { min = 2, max = 1 }\n"
        "[[layer]]\n"
        'name = "rest"\n'
        'comment = "the rest"\n'
        "match = [[]]\n"
    )
    lines = _errors(path)
    assert lines == [
        f'{path}:3:1: agent.mode: \'enforced\': expected one of "enforce", "observe" '
        '(did you mean "enforce"?)',
        f"{path}:6:1: layer[0].coment: unknown key (a typo?); expected one of name, comment, "
        "match, kind, cpus, sched, numa, governor, min_freq, epp, irqs, numa_migrate, preempt, "
        'preemptible, util, growth (did you mean "comment"?)',
        f"{path}:4:3: layer[0].comment: expected this key (it is required)",
        f"{path}:7:13: layer[0].match[0][0].comm_prefx: unknown predicate; expected one of "
        + ", ".join((*PREDICATES, "not"))
        + ' (did you mean "comm_prefix" or "pcomm_prefix"?)',
        f"{path}:7:39: layer[0].match[1][0].job_role: 'ranks': expected a job role: launcher, "
        'rank, data, compile, helper, other (did you mean "rank"?)',
        f"{path}:9:1: layer[0].cpus: {{'min': 2, 'max': 1}}: expected min no larger than max",
    ]


def test_every_sizing_error_at_once(tmp_path: Path) -> None:
    """Self-sizing keys (util, growth, [sizing]) report like every other key: all at once,
    each with its position, value, what was expected and what was probably meant."""
    path = tmp_path / "sizing.toml"
    path.write_text(
        "version = 1\n"
        "[sizing]\n"
        "interval = 2\n"
        "shrink_after = 1\n"
        "shrinkafter = 3\n"
        "[[layer]]\n"
        'name = "data"\n'
        'comment = "loaders"\n'
        'match = [[{ comm_prefix = "pt_data" }]]\n'
        'kind = "confined"\n'
        "util = { low = 0.9, hihg = 0.95 }\n"
        'growth = "nodes"\n'
        "[[layer]]\n"
        'name = "bursty"\n'
        'comment = "compilers"\n'
        'match = [[{ comm_prefix = "cc1" }]]\n'
        "util = { low = 0, high = 2 }\n"
        "[[layer]]\n"
        'name = "rest"\n'
        'comment = "the rest"\n'
        "match = [[]]\n"
    )
    assert _errors(path) == [
        f"{path}:11:21: layer[0].util.hihg: unknown key (a typo?); expected one of low, high "
        '(did you mean "high"?)',
        f"{path}:11:1: layer[0].util: {{'low': 0.9, 'hihg': 0.95}}: expected low below high "
        "(a band to stay in, not a point)",
        f'{path}:12:1: layer[0].growth: \'nodes\': expected one of "sticky", "llc", "node" '
        '(did you mean "node"?)',
        f"{path}:17:1: layer[1].util: {{'low': 0, 'high': 2}}: expected no util on an \"open\" "
        "layer (it has no CPUs of its own to size)",
        f"{path}:5:1: sizing.shrinkafter: unknown key (a typo?); expected one of interval, "
        'shrink_after (did you mean "shrink_after"?)',
        f"{path}:4:1: sizing.shrink_after: 1: expected seconds (at least sizing.interval), "
        "2 to 86400",
    ]


@pytest.mark.parametrize("name", _params())
def test_error_fields_match_the_message(name: str) -> None:
    path = BAD / name
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    exc = info.value
    assert exc.source == str(path)
    assert exc.key.strip("'\"") == EXPECTED[name]["key"]
    assert isinstance(exc, ValueError)


def test_missing_file_is_a_policy_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    message = _error(path)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert "a readable file (No such file or directory)" in message


def test_folder_is_a_policy_error(tmp_path: Path) -> None:
    message = _error(tmp_path)
    assert message == f"{tmp_path}: expected a policy file, not a folder"


def test_long_values_are_shortened(tmp_path: Path) -> None:
    path = tmp_path / "long.toml"
    path.write_text(
        f'version = 1\n[[layer]]\nname = "rest"\ncomment = "c"\nmatch = [[]]\n'
        f'kind = "{"x" * 200}"\n'
    )
    message = _error(path)
    assert "x" * 60 not in message and "..." in message
    assert message.startswith(f"{path}:6:1: layer[0].kind: ")


# -- the command line ---------------------------------------------------------------------------
def _run(*args: str) -> subprocess.CompletedProcess[str]:
    assert HOSTD is not None
    return subprocess.run(
        [HOSTD, "policy", "check", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def batch() -> subprocess.CompletedProcess[str]:
    """One ``hostd policy check`` over the whole corpus (one interpreter start, not 100)."""
    return _run(*(str(BAD / name) for name in CORPUS))


@needs_cli
def test_cli_batch_exits_2_without_traceback(batch: subprocess.CompletedProcess[str]) -> None:
    assert batch.returncode == 2, batch.stderr[-2000:]
    assert "Traceback" not in batch.stderr + batch.stdout


@needs_cli
@pytest.mark.parametrize("name", _params())
def test_cli_prints_the_one_line(name: str, batch: subprocess.CompletedProcess[str]) -> None:
    path = BAD / name
    errors = _errors(path)
    lines = [line for line in batch.stderr.splitlines() if f"{path}:" in line]
    assert lines == [f"hostd: {e}" for e in errors], lines


# One file per family of checks, each in its own process: exit status and stderr of exactly
# one bad file (the batch above proves every file gives its line; these prove "FILE -> 2").
SINGLE = [
    "toml-syntax.toml",
    "not-utf8.toml",
    "unknown-top-key.toml",
    "empty-layer-list.toml",
    "missing-comment.toml",
    "percent-over-100.toml",
    "priority-without-rt.toml",
    "regex-invalid.toml",
    "not-not.toml",
    "catch-all-not-last.toml",
]


@needs_cli
@pytest.mark.parametrize("name", SINGLE)
def test_cli_single_file_exits_2(name: str) -> None:
    path = BAD / name
    result = _run(str(path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"hostd: {e}" for e in _errors(path)], result.stderr


@needs_cli
def test_cli_missing_file_exits_2(tmp_path: Path) -> None:
    result = _run(str(tmp_path / "absent.toml"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@needs_cli
def test_cli_good_files_exit_0() -> None:
    files = [str(p) for p in sorted(GOOD.glob("*.toml"))]
    files.append(str(REPO / "policies" / "training.toml"))
    result = _run(*files)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    for f in files:
        assert f"{f}: ok" in result.stdout


@needs_cli
def test_cli_one_bad_among_good_exits_2() -> None:
    good = str(REPO / "policies" / "training.toml")
    bad = BAD / "min-above-max.toml"
    result = _run(good, str(bad))
    assert result.returncode == 2
    assert f"{good}: ok" in result.stdout
    assert result.stderr.strip().endswith(_error(bad))


# -- files that are not plain policy files ----------------------------------------------------
def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    """A FIFO hung `policy check` (and kept a reloading agent from hearing SIGTERM)."""
    import os

    fifo = tmp_path / "policy.toml"
    os.mkfifo(fifo)
    assert _error(fifo) == f"{fifo}: expected a regular file (not a FIFO or a device)"


def test_a_symlink_loop_is_a_policy_error(tmp_path: Path) -> None:
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.symlink_to(b)
    b.symlink_to(a)
    assert "Too many levels of symbolic links" in _error(a)


def test_a_file_over_a_mebibyte_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge.toml"
    path.write_bytes(b"# " + b"x" * (1 << 20) + b"\n")
    assert _error(path) == f"{path}: expected a policy file of at most 1 MiB"


@needs_cli
def test_run_with_a_looping_policy_path_is_exit_2(tmp_path: Path) -> None:
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.symlink_to(b)
    b.symlink_to(a)
    out = subprocess.run(
        [HOSTD, "run", "--policy", str(a), "--mode", "observe", "--once", "--run-dir",
         str(tmp_path / "r"), "--state-dir", str(tmp_path / "s")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
