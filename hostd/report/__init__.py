"""Did protection help? A job's attempts with and without hostd, compared (``hostd report``).

The agent records each attempt of a job it sees as one JSON file, ``STATE_DIR/attempts/NAME.json``
(schema ``hostd.attempt/1``: the job, whether hostd protected it and why not, its start and end,
and samples of its threads' CPU time and run-queue wait per layer, of its GPUs' utilisation and
of the throughput the job itself reported). This package reads them and says, in plain words,
whether the protected attempts ran faster than the unprotected ones (A/B), and how much attempts
differ among themselves when nothing changed (A/A: the noise an effect must exceed).

Its pieces, each a module; each imports only those listed before it:

* ``errors``: ``ReportError``, a report that cannot be made;
* ``load``: ``load_attempts`` (files -> records and warnings), ``summarise`` (one attempt);
* ``prom``: ``fetch``, the same records from a Prometheus server that scrapes the agents
  (``hostd report --prometheus``: every node's attempts), and what its metrics do not say;
* ``verdict``: one comparison said in plain words;
* ``stats``: ``compare`` (one job) and ``compare_all`` (every job, or the one named): the
  measure, the A/B ratio and its bootstrap interval, the A/A noise, the verdict;
* ``fleet``: ``fleet``, each job host by host: each host's arms and A/B, the hosts and jobs
  slower under protection, the A/A noise between hosts;
* ``plots``: the figures, ``save_figure`` (matplotlib, imported only there: ``ReportError``
  when it is missing);
* ``html``: ``render_html``, the self-contained page.

Pure functions but for reading the records (files, or Prometheus' HTTP API) and writing a
figure. Called by ``hostd.cli.report``
and ``bench/ab.py``, through the names re-exported here.
"""

from __future__ import annotations

from hostd.report.errors import ReportError
from hostd.report.fleet import fleet
from hostd.report.html import render_html
from hostd.report.load import ATTEMPTS, load_attempts, summarise
from hostd.report.plots import FIGURES, NEEDS_MATPLOTLIB, save_figure
from hostd.report.prom import BadInput, Fetched, fetch, window
from hostd.report.stats import CONFIDENCE, RESAMPLES, SEED, compare, compare_all

__all__ = [
    "ATTEMPTS",
    "CONFIDENCE",
    "FIGURES",
    "NEEDS_MATPLOTLIB",
    "RESAMPLES",
    "SEED",
    "BadInput",
    "Fetched",
    "ReportError",
    "compare",
    "compare_all",
    "fetch",
    "fleet",
    "load_attempts",
    "render_html",
    "save_figure",
    "summarise",
    "window",
]
