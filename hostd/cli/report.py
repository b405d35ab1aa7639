"""``hostd report``: did protection help? A job's attempts with and without hostd, compared.

Reads the attempt records the agent writes (``STATE_DIR/attempts/*.json``, or ``--dir``), or,
with ``--prometheus URL``, builds the same records of every node from a Prometheus server that
scrapes the agents (``--since``, ``--until``, ``--step``, ``--selector``); compares each job's
protected and unprotected attempts with ``hostd.report`` and writes a self-contained HTML page
(the verdict, a table, plots inline; no network needed to open it), or prints the numbers with
``--json``. Where the attempts ran on several hosts, each host's too (``hostd.report.fleet``).
A record it cannot read is skipped with a warning.
"""

from __future__ import annotations

import os
import sys
import time

import typer

from hostd.cli.common import EXIT_FAILURE, JsonOpt, fail, print_json
from hostd.report import (
    ATTEMPTS,
    BadInput,
    ReportError,
    compare_all,
    fetch,
    fleet,
    load_attempts,
    render_html,
    summarise,
    window,
)
from hostd.statedir import DEFAULT_STATE_DIR

StateDirOpt = typer.Option(
    DEFAULT_STATE_DIR,
    "--state-dir",
    envvar="HOSTD_STATE_DIR",
    help=f"hostd's state folder: attempts are read from its {ATTEMPTS}/ folder.",
)
SINCE = "24h"


def _from_prometheus(
    url: str, since: str | None, until: str | None, step: str | None, selector: str | None
) -> tuple[list[dict], dict]:
    try:
        got = fetch(url, window(since or SINCE, until, step, time.time()), selector)
    except BadInput as exc:
        fail(str(exc))
    except ReportError as exc:
        fail(str(exc), EXIT_FAILURE)
    return got.attempts, got.source


def report(
    state_dir: str = StateDirOpt,
    job: str | None = typer.Option(None, "--job", help="Only this job (default: every job)."),
    output: str = typer.Option(
        "hostd-report.html", "--output", "-o", help="Where to write the HTML page."
    ),
    as_json: bool = JsonOpt,
    attempts_dir: str | None = typer.Option(
        None,
        "--dir",
        help=f"Read attempt records from this folder (default: STATE_DIR/{ATTEMPTS}).",
    ),
    prometheus: str | None = typer.Option(
        None,
        "--prometheus",
        metavar="URL",
        help="Build the records of every node from this Prometheus server, which scrapes the "
        "agents (http://prometheus:9090), instead of reading files.",
    ),
    since: str | None = typer.Option(
        None,
        "--since",
        help=f"With --prometheus: from this time, RFC 3339 or a time ago such as 6h "
        f"(default {SINCE}).",
    ),
    until: str | None = typer.Option(
        None, "--until", help="With --prometheus: to this time, as --since (default now)."
    ),
    step: str | None = typer.Option(
        None,
        "--step",
        help="With --prometheus: a value every this long, such as 15s (default: 15 s, longer "
        "where the range would give more than 1000 values).",
    ),
    selector: str | None = typer.Option(
        None,
        "--selector",
        help="With --prometheus: label matchers added to every query, such as "
        '{cluster="a",training_job=~"llama.*"}.',
    ),
) -> None:
    """Did protection help? Compare a job's attempts with and without hostd (A/B) and among
    themselves (A/A, the noise): a verdict in plain words and an HTML page with plots."""
    asked = {"--since": since, "--until": until, "--step": step, "--selector": selector}
    if prometheus is None and any(v is not None for v in asked.values()):
        fail(f"{next(k for k, v in asked.items() if v is not None)} needs --prometheus URL")
    source: dict = {}
    if prometheus is not None:
        if attempts_dir is not None:
            fail("--dir and --prometheus: read attempts from one or the other")
        attempts, source = _from_prometheus(prometheus, since, until, step, selector)
        where: dict = {"prometheus": source}
    else:
        folder = attempts_dir or os.path.join(state_dir, ATTEMPTS)
        try:
            attempts, warnings = load_attempts(folder)
        except ReportError as exc:
            fail(str(exc), EXIT_FAILURE)
        for warning in warnings:
            sys.stderr.write(f"hostd: warning: {warning}\n")
        if not attempts:
            fail(
                f"no attempts recorded in {folder}: the agent records attempts of jobs it sees "
                '(docs/operations.md, "A/B rollout"); run some with HOSTD_PROTECT=0 in their '
                "environment to compare them with protected ones",
                EXIT_FAILURE,
            )
        where = {"folder": str(folder)}
    try:
        comparisons = compare_all(attempts, job)
    except ReportError as exc:
        fail(f"--job {job}: {exc}" if job is not None else str(exc))
    summaries = [summarise(a) for a in attempts if job is None or a.get("job") == job]
    hosts = {s["host"] for s in summaries if s["host"]}
    hosted = fleet(comparisons, summaries) if source or len(hosts) > 1 else None
    if as_json:
        more = {"fleet": hosted} if hosted is not None else {}
        print_json({**where, "comparisons": comparisons, "attempts": summaries, **more})
        return
    origin = (
        f"From Prometheus at {source['url']}, {source['start']} to {source['end']}, a value "
        f"every {source['step_s']:g} s" + (f", {source['selector']}" if source["selector"] else "")
        if source
        else None
    )
    try:
        page = render_html(comparisons, summaries, hosted, origin, source.get("notes", ()))
    except ReportError as exc:
        fail(str(exc), EXIT_FAILURE)
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(page)
    except OSError as exc:
        fail(f"--output {output}: cannot write it ({exc.strerror or exc})", EXIT_FAILURE)
    lines = [f"wrote {output}"]
    if len(comparisons) == 1:
        lines[0] += f": {comparisons[0]['verdict']}"
    else:
        lines += [f"{c['job']}: {c['verdict']}" for c in comparisons]
    if hosted is not None:
        lines.append(f"hosts: {hosted['verdict']}")
    sys.stdout.write("\n".join(lines) + "\n")
