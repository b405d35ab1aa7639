"""The one exception of ``hostd.report``: a report that cannot be made. Raised by ``load``,
``stats`` and ``plots``; ``hostd.cli.report`` turns it into a message and an exit code."""


class ReportError(Exception):
    """A report that cannot be made: no attempts, an unknown job, matplotlib missing."""
