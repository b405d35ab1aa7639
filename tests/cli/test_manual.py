"""The man page and the completions come from the command line itself, and the table of commands
(docs/commands.md, linked from README) says only what the command line has."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from hostd.cli import app
from hostd.cli.manual import _commands, _options, completion, man_page, write

REPO = Path(__file__).resolve().parents[2]
COMMAND_TABLE = REPO / "docs/commands.md"
COMMANDS = dict(_commands(typer.main.get_command(app)))


def test_the_man_page_has_every_command_and_option():
    page = man_page()
    assert page.startswith(".TH HOSTD 1 ")
    for name, cmd in COMMANDS.items():
        assert f".B hostd {name}" in page, name
        for option in _options(cmd):
            assert f".B {', '.join(option.opts)}" in page, (name, option.opts)
    for code in ("0", "1", "2", "3", "5"):
        assert f".TP\n.B {code}\n" in page


def test_completions_for_three_shells(tmp_path):
    written = {p.name for p in write(tmp_path)}
    assert written == {"hostd.1", "hostd.bash", "_hostd", "hostd.fish"}
    assert "_HOSTD_COMPLETE=complete_bash" in completion("bash")
    assert "compdef _hostd_completion hostd" in completion("zsh")
    assert "complete --command hostd" in completion("fish")


def test_the_command_table_names_only_commands_and_options_the_cli_has():
    """Every row of the table of commands (docs/commands.md): the command exists, and each option
    the row names is one of that command's."""
    readme = COMMAND_TABLE.read_text()
    table = readme[readme.index("## Commands") :]
    table = table[: table.index("\n\n", table.index("| command |"))]
    rows = [ln for ln in table.splitlines() if ln.startswith("| `hostd ")]
    seen = set()
    for row in rows:
        first = row.replace("\\|", "/").split("|")[1]
        for usage in re.findall(r"`hostd ([^`]+)`", first):
            words = [w for w in usage.split() if re.fullmatch(r"[a-z]+", w)]
            name = " ".join(words[:2]) if " ".join(words[:2]) in COMMANDS else words[0]
            assert name in COMMANDS, usage
            seen.add(name)
            cmd_opts = {o for opt in _options(COMMANDS[name]) for o in opt.opts}
            for opt in re.findall(r"(--[a-z][a-z-]*)", usage):
                assert opt in cmd_opts, (name, opt)
    assert seen == set(COMMANDS), set(COMMANDS) - seen


def test_the_command_table_says_which_commands_take_policy_and_root():
    readme = COMMAND_TABLE.read_text()
    for option in ("--policy", "--root"):
        said = readme[readme.index(f"`{option} ") :]
        said = said[: said.index(". ")]
        listed = set(re.findall(r"`([a-z]+(?: [a-z]+)?)`", said))
        having = {
            name
            for name, cmd in COMMANDS.items()
            if any(option in opt.opts for opt in _options(cmd))
        }
        assert listed == having, (option, listed ^ having)


def test_the_commands_that_show_threads_choose_them_alike():
    for name in ("classify", "stats", "plan"):
        opts = {o for opt in _options(COMMANDS[name]) for o in opt.opts}
        assert {"--pid", "--tid", "--layer"} <= opts, name
        helps = {opt.opts[0]: opt.help for opt in _options(COMMANDS[name])}
        assert helps["--pid"] == "Only this process and its descendants' threads (repeatable)."
