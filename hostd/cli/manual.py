"""``hostd``'s man page and shell completions, generated from the command line itself.

``python -m hostd.cli.manual OUT`` writes ``OUT/hostd.1`` (roff: every command with its
arguments, options and help, the exit codes, the environment variables hostd reads and
examples), ``OUT/hostd.bash``, ``OUT/_hostd`` (zsh) and ``OUT/hostd.fish`` (typer's completion
scripts, which ask ``hostd`` itself what completes). The deb and the rpm run it at build time and
install the files where man(1) and the shells look; ``hostd manual`` prints the page for a pip
install (``hostd manual | man -l -``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer.main
from typer._completion_shared import get_completion_script

from hostd import __version__

EXIT_CODES = (
    ("0", "ok"),
    ("1", "runtime failure (hostd status: the agent ended without restoring: run hostd restore)"),
    ("2", "bad input: a bad policy (every error, one line each, with file:line:column), an "
          "unknown thread, a missing --root"),
    ("3", "partial (hostd restore could not read every journal line; hostd status: not running, "
          "nothing to restore)"),
    ("5", "hostd status: the agent runs, switched off by hostd disable"),
)  # fmt: skip
# Every HOSTD_* variable hostd reads, one line each (tests/cli/test_manual.py greps the source
# for them: a new one needs its line here).
ENVIRONMENT = (
    ("HOSTD_STATE_DIR", "the folder of the journal and the job records: the default of every "
                        "--state-dir (/var/lib/hostd)"),
    ("HOSTD_RUN_DIR", "the folder of the agent's pid, status and switch files: the default of "
                      "every --run-dir (/run/hostd)"),
    ("HOSTD_SIDECAR", "1: hostd run --sidecar (manage only this pod's tasks, host-wide knobs "
                      "off); hostd doctor --sidecar"),
    ("HOSTD_METRICS_ADDRESS", "the address the agent's Prometheus exporter listens on, over "
                              "[metrics] address (a DaemonSet sets the pod's IP)"),
    ("HOSTD_METRICS_PORT", "the exporter's port, over [metrics] port"),
    ("HOSTD_CONNECTOR_RCVBUF", "the receive buffer of the proc connector socket, in bytes (a "
                               "small one provokes overflows in tests)"),
    ("HOSTD_PROTECT", "in a job's environment: 1 asks for hostd's protection, 0 refuses it "
                      "(for A/B comparisons; [jobs] protect decides for a job that says nothing)"),
    ("HOSTD_JOB", "in a job's environment: the job's name in its records and in hostd report, "
                  "whatever launched it"),
    ("HOSTD_THROUGHPUT_FILE", "in a job's environment: a file whose first line the job rewrites "
                              "with its throughput, <number> [unit] (12.5 steps/s), recorded "
                              "per attempt"),
    ("_HOSTD_COMPLETE", "set by the shell completion scripts when they ask hostd what completes"),
)  # fmt: skip
EXAMPLES = (
    ("hostd doctor", "What this host allows and what hostd will and will not do here."),
    ("hostd plan", "What the agent would do on this host now, changing nothing."),
    ("sudo hostd demo", "The effect in about a minute and a half: a stand-in job alone, under "
                        "contention, and protected; everything restored after."),
    ("sudo hostd run --mode observe", "The agent, deciding and reporting but changing nothing."),
    ("sudo hostd run --policy /etc/hostd/policy.toml", "The agent with a policy file; Ctrl-C "
                                                       "restores."),
    ("hostd status", "Whether the agent runs, its mode, policy, layers and last pass."),
    ("sudo hostd changes", "Every knob hostd holds changed: before hostd, now, and which "
                           "someone else changed since."),
    ("sudo hostd restore", "Put back every knob hostd changed (after a crash)."),
    ("hostd policy list", "The installed policies, which one is the default, where each lives."),
    ("hostd policy show gentle", "Every effective value of an installed policy."),
    ("hostd policy check my-policy.toml", "Validate a policy: every error, one line each."),
    ("hostd report --job train -o report.html", "Did protection help a job? Its attempts with "
                                                "and without hostd compared, as HTML."),
    ("hostd manual | man -l -", "This page, for a pip install."),
)  # fmt: skip
SHELLS = (("bash", "hostd.bash"), ("zsh", "_hostd"), ("fish", "hostd.fish"))


def _roff(text: str) -> str:
    """Text safe in roff: backslashes doubled, a leading dot or quote escaped."""
    text = text.replace("\\", "\\e")
    lines = [("\\&" + ln) if ln.startswith((".", "'")) else ln for ln in text.splitlines()]
    return "\n".join(lines)


# typer carries its own copy of click: commands and parameters are told apart by what they have.
def _commands(group: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for name in sorted(group.commands):
        cmd = group.commands[name]
        if cmd.hidden:
            continue
        if hasattr(cmd, "commands"):
            out += _commands(cmd, f"{prefix}{name} ")
        else:
            out.append((f"{prefix}{name}", cmd))
    return out


def _options(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]


def _usage(name: str, cmd: Any) -> str:
    parts = [f"hostd {name}"]
    for p in cmd.params:
        if p.param_type_name == "argument":
            meta = p.name.upper() if p.name else "ARG"
            parts.append(f"{meta}..." if p.nargs == -1 else meta)
    if _options(cmd):
        parts.append("[OPTIONS]")
    return " ".join(parts)


def man_page() -> str:
    """The man page, roff, from the command tree."""
    root = typer.main.get_command(_app())
    out = [
        f'.TH HOSTD 1 "" "hostd {__version__}" "User Commands"',
        ".SH NAME",
        "hostd \\- keep the latency-critical threads of AI training jobs fed, from userspace",
        ".SH SYNOPSIS",
        ".B hostd",
        "\\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
        ".SH DESCRIPTION",
        _roff(
            "hostd classifies every thread into the layers of a policy (trainer, comms, data, "
            "helpers, the rest), plans their CPUs, scheduling, IRQs, governors and NUMA "
            "placement from the host's topology, applies the plan, journals every original value "
            "first and puts the host back on exit or with hostd restore. The commands that only "
            "read work for every user."
        ),
        ".SH COMMANDS",
    ]
    for name, cmd in _commands(root):
        out.append(".TP")
        out.append(f".B {_roff(_usage(name, cmd))}")
        out.append(_roff((cmd.help or "").strip()))
        for p in _options(cmd):
            flags = ", ".join(p.opts)
            if not p.is_flag:
                flags += f" {p.name.upper() if p.name else 'VALUE'}"
            out.append(".RS")
            out.append(".TP")
            out.append(f".B {_roff(flags)}")
            out.append(_roff(p.help or ""))
            out.append(".RE")
    out.append(".SH EXIT STATUS")
    for code, what in EXIT_CODES:
        out += [".TP", f".B {code}", _roff(what)]
    out.append(".SH ENVIRONMENT")
    for name, what in ENVIRONMENT:
        out += [".TP", f".B {name}", _roff(what)]
    out += [
        ".SH FILES",
        ".TP",
        ".B /etc/hostd/policy.toml",
        "The policy the packaged service runs (hostd policy show prints the default).",
        ".TP",
        ".B /var/lib/hostd/journal.jsonl",
        "Every original value hostd changed, written before the change.",
        ".TP",
        ".B /run/hostd/",
        "The agent's pid, status and switch files.",
        ".TP",
        ".B hostd/policy/*.toml",
        "The installed policies, in the Python package (hostd policy list says where).",
        ".SH EXAMPLES",
    ]
    for line, what in EXAMPLES:
        out += [".TP", f".B {_roff(line)}", _roff(what)]
    out += [
        ".SH SEE ALSO",
        "README.md of the hostd source, and hostd \\fICOMMAND\\fR \\-\\-help.",
    ]
    return "\n".join(out) + "\n"


def manual() -> None:
    """Print hostd's man page (roff), the same as man hostd from the deb or the rpm: read it
    with hostd manual | man -l -."""
    sys.stdout.write(man_page())


def _app() -> typer.Typer:
    from hostd.cli import app

    return app


def completion(shell: str) -> str:
    """typer's completion script for ``shell`` (bash, zsh, fish)."""
    return get_completion_script(prog_name="hostd", complete_var="_HOSTD_COMPLETE", shell=shell)


def write(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "hostd.1"]
    written[0].write_text(man_page())
    for shell, name in SHELLS:
        (folder / name).write_text(completion(shell))
        written.append(folder / name)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m hostd.cli.manual OUT")
    for path in write(sys.argv[1]):
        print(path)
