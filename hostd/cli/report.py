"""``hostd report``: did protection help? A job's attempts with and without hostd, compared.

Reads the attempt records the agent writes (``STATE_DIR/attempts/*.json``, or ``--dir``),
compares each job's protected and unprotected attempts with ``hostd.report`` and writes a
self-contained HTML page (the verdict, a table, plots inline; no network needed to open it), or
prints the numbers with ``--json``. A record it cannot read is skipped with a warning.
"""

from __future__ import annotations

import os
import sys

import typer

from hostd.cli.common import EXIT_FAILURE, JsonOpt, fail, print_json
from hostd.report import (
    ATTEMPTS,
    ReportError,
    compare_all,
    load_attempts,
    render_html,
    summarise,
)
from hostd.statedir import DEFAULT_STATE_DIR

StateDirOpt = typer.Option(
    DEFAULT_STATE_DIR,
    "--state-dir",
    envvar="HOSTD_STATE_DIR",
    help=f"hostd's state folder: attempts are read from its {ATTEMPTS}/ folder.",
)


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
) -> None:
    """Did protection help? Compare a job's attempts with and without hostd (A/B) and among
    themselves (A/A, the noise): a verdict in plain words and an HTML page with plots."""
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
    try:
        comparisons = compare_all(attempts, job)
    except ReportError as exc:
        fail(f"--job {job}: {exc}" if job is not None else str(exc))
    summaries = [summarise(a) for a in attempts if job is None or a.get("job") == job]
    if as_json:
        print_json({"folder": str(folder), "comparisons": comparisons, "attempts": summaries})
        return
    try:
        page = render_html(comparisons, summaries)
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
    sys.stdout.write("\n".join(lines) + "\n")
