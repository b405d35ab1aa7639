"""The man page says every HOSTD_* variable hostd reads (found by grepping the source, so a new
variable without its line fails here) and gives examples; ``hostd manual`` prints it for a pip
install."""

from __future__ import annotations

import re

import typer.main

from hostd.cli import app
from hostd.cli.manual import EXAMPLES, _commands, _options, man_page
from tests.cli.test_cli import REPO, hostd

VARIABLE = re.compile(r"(?<![A-Za-z0-9])_?HOSTD_[A-Z0-9_]*[A-Z0-9]")


def _section(page: str, name: str) -> str:
    start = page.index(f"\n.SH {name}\n") + len(f"\n.SH {name}\n")
    end = page.find("\n.SH ", start)
    return page[start:] if end < 0 else page[start:end]


def variables_in_the_source() -> set[str]:
    found = set()
    for path in (REPO / "hostd").rglob("*.py"):
        found |= set(VARIABLE.findall(path.read_text()))
    return found


def test_environment_lists_every_hostd_variable_the_source_reads():
    found = variables_in_the_source()
    assert len(found) >= 9, found
    section = _section(man_page(), "ENVIRONMENT")
    listed = re.findall(r"^\.TP\n\.B (\S+)\n(.+)$", section, re.M)
    names = [name for name, _ in listed]
    assert len(names) == len(set(names))
    assert set(names) == found, ("missing", found - set(names), "stale", set(names) - found)
    assert all(what.strip() for _, what in listed)


def test_examples_cover_the_first_hour():
    section = _section(man_page(), "EXAMPLES")
    for command in ("doctor", "plan", "demo", "run --mode observe", "status", "restore",
                    "policy check", "policy list", "report", "manual"):  # fmt: skip
        assert re.search(rf"^\.B (sudo )?hostd {command}\b", section, re.M), command


def test_every_example_names_a_command_and_options_the_cli_has():
    commands = dict(_commands(typer.main.get_command(app)))
    for line, _ in EXAMPLES:
        words = line.split("|")[0].split()
        words = words[words.index("hostd") + 1 :]
        name = " ".join(words[:2]) if " ".join(words[:2]) in commands else words[0]
        assert name in commands, line
        having = {o for opt in _options(commands[name]) for o in opt.opts}
        for option in (w for w in words if w.startswith("-")):
            assert option in having, (line, option)


def test_hostd_manual_prints_the_man_page():
    proc = hostd("manual")
    assert proc.stdout == man_page()
    assert "\n.SH ENVIRONMENT\n" in proc.stdout and "\n.SH EXAMPLES\n" in proc.stdout
