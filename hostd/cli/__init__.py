"""The ``hostd`` command line (typer). One module per command group; each only renders.

Entry point ``main()`` is the console script. Every listing has ``--json``; exit codes: 0 ok,
1 runtime failure, 2 bad input.
"""

from __future__ import annotations

import typer

from hostd import __version__
from hostd.cli import agent as agent_cmd
from hostd.cli import changes as changes_cmd
from hostd.cli import classify as classify_cmd
from hostd.cli import demo as demo_cmd
from hostd.cli import manual as manual_cmd
from hostd.cli import plan as plan_cmd
from hostd.cli import policy as policy_cmd
from hostd.cli import report as report_cmd
from hostd.cli import stats as stats_cmd
from hostd.cli import status as status_cmd
from hostd.cli import topo as topo_cmd

app = typer.Typer(
    help="hostd: keep the latency-critical threads of AI training jobs fed, from userspace.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hostd {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """hostd: classify every thread into layers, plan its CPUs, and explain why."""


app.command("topo")(topo_cmd.topo)
app.command("classify")(classify_cmd.classify)
app.command("explain")(classify_cmd.explain)
app.command("plan")(plan_cmd.plan)
app.command("stats")(stats_cmd.stats)
app.command("top")(stats_cmd.top)
app.add_typer(policy_cmd.app, name="policy")
app.command("run")(agent_cmd.run)
app.command("restore")(agent_cmd.restore)
app.command("status")(status_cmd.status)
app.command("changes")(changes_cmd.changes)
app.command("enable")(agent_cmd.enable)
app.command("disable")(agent_cmd.disable)
app.command("doctor")(agent_cmd.doctor)
app.command("demo")(demo_cmd.demo)
app.command("report")(report_cmd.report)
app.command("manual")(manual_cmd.manual)


def main() -> None:
    app()
