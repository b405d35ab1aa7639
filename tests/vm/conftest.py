"""The VM tier's outer fixtures: boot the VM once per pytest session, and report its cost.

``vm_tier`` (session scope) boots the VM of ``tests/vm/vm.py`` the first time a test asks for
it and runs every test of ``tests/vm/inside`` there in that single boot; where the VM cannot
boot here (no QEMU, no kernel in the cache, not x86-64, QEMU or the kernel refusing to start)
it skips, with the reason, every test that asks for it. The inner tests are never collected by
the outer run (``collect_ignore``): only the VM (``HOSTD_IN_VM=1``) collects them.
"""

from __future__ import annotations

import os

import pytest

from tests.vm import vm

IN_VM = os.environ.get("HOSTD_IN_VM") == "1"
collect_ignore = [] if IN_VM else ["inside"]

_RUN = pytest.StashKey[vm.TierRun]()


@pytest.fixture(scope="session")
def vm_tier(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> vm.TierRun:
    if IN_VM:
        pytest.skip("already inside the VM")
    try:
        run = vm.run_tier(tmp_path_factory.mktemp("vm"))
    except vm.Unavailable as exc:
        pytest.skip(f"VM tier: {exc}")
    request.config.stash[_RUN] = run
    return run


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    run = config.stash.get(_RUN, None)
    if run is None:
        return
    boot = f"{run.boot_s:.1f} s" if run.boot_s is not None else "?"
    tests = f"{run.tests_s:.1f} s" if run.tests_s is not None else "?"
    terminalreporter.write_line(
        f"VM tier: one boot, {run.wall_s:.1f} s in all (kernel to tests {boot}, "
        f"inner pytest {tests}); inner exit status {run.rc}; work folder {run.work}"
    )
