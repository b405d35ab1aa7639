"""hostd's folders and the one-agent-per-host lock (root): folders another user can write are
refused, a link planted in them is never followed, a switch another user made is not honoured,
ordinary users are refused in one line, and a second agent or a restore under a running agent
refuses whatever run and state dirs it was given."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hostd.statedir import UnsafeDir, open_dir, owned_file, write_atomic
from tests.privileged.test_agent import POLICY, Agent
from tests.workload import TrainingJob

_sibling = Path(sys.executable).with_name("hostd")
HOSTD = str(_sibling) if _sibling.exists() else None
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: plays another user"),
    pytest.mark.skipif(HOSTD is None, reason="the hostd console script is not installed"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv(1)"),
]


def hostd(*args: str, user: list[str] | None = None) -> subprocess.CompletedProcess:
    argv = [*(user or []), HOSTD, *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_a_folder_others_can_write_is_refused_and_a_planted_link_is_not_followed(tmp_path):
    victim = tmp_path / "root-only"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    os.chown(run, 65534, 65534)  # nobody's folder: nobody planted a link in it
    (run / "status.json").symlink_to(victim)
    out = hostd("run", "--policy", str(POLICY), "--run-dir", str(run), "--state-dir",
                str(tmp_path / "state"), "--mode", "observe", "--once")  # fmt: skip
    assert out.returncode == 1 and "owned by uid 65534" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert victim.read_text() == "precious\n"
    os.chown(run, 0, 0)
    run.chmod(0o777)
    with pytest.raises(UnsafeDir, match="writable by group or others"):
        open_dir(run)


def test_files_are_replaced_without_following_links(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    fd = open_dir(run)
    try:
        (run / "status.json").symlink_to(victim)  # as if planted before the folder was checked
        (run / f".status.json.{os.getpid()}.tmp").symlink_to(victim)
        write_atomic(fd, "status.json", b"{}")
    finally:
        os.close(fd)
    assert victim.read_text() == "precious\n"
    assert not (run / "status.json").is_symlink() and (run / "status.json").read_text() == "{}"
    assert oct((run).stat().st_mode & 0o777) == oct(0o755)


def test_a_switch_file_another_user_made_is_not_honoured(tmp_path):
    flag = tmp_path / "disabled"
    flag.touch()
    assert owned_file(flag)
    os.chown(flag, 65534, 65534)
    assert not owned_file(flag)
    flag.unlink()
    flag.symlink_to(tmp_path)
    assert not owned_file(flag)


@pytest.mark.parametrize("command", ["disable", "enable", "restore", "run"])
def test_an_ordinary_user_is_refused_in_one_line(tmp_path, command):
    tmp_path.chmod(0o755)
    out = hostd(command, "--run-dir", str(tmp_path / "run"), user=NOBODY)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "needs root" in out.stderr and len(out.stderr.strip().splitlines()) == 1


# Every read-only command, as an ordinary user: it works (what it cannot read it says, never a
# traceback), exit 0 (status: 3, no agent runs in an empty run dir).
READ_ONLY = [
    (["status"], 3),
    (["status", "--json"], 3),
    (["classify"], 0),
    (["classify", "--json"], 0),
    (["explain", "1"], 0),
    (["plan"], 0),
    (["plan", "--json"], 0),
    (["stats", "--interval", "0.2"], 0),
    (["topo"], 0),
    (["topo", "--json"], 0),
    (["doctor"], 0),
    (["policy", "check", "POLICY"], 0),
    (["policy", "show"], 0),
    (["--version"], 0),
]


@pytest.mark.parametrize(("args", "code"), READ_ONLY, ids=[" ".join(a) for a, _ in READ_ONLY])
def test_every_read_only_command_works_for_an_ordinary_user(tmp_path, args, code):
    tmp_path.chmod(0o755)
    args = [str(POLICY) if a == "POLICY" else a for a in args]
    if args[0] in ("status", "plan"):
        args += ["--run-dir", str(tmp_path / "run")]
    out = hostd(*args, user=NOBODY)
    assert out.returncode == code, out.stdout + out.stderr
    assert out.stdout.strip(), out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    if args[0] in ("classify", "explain", "plan", "stats"):  # what it cannot see: said once
        said = [ln for ln in out.stderr.splitlines() if "as uid 65534" in ln]
        assert len(said) == 1, out.stderr


def test_one_agent_per_host_whatever_its_folders(tmp_path):
    with TrainingJob(ranks=1, workers=0) as job:
        agent = Agent(tmp_path, job.launcher)
        try:
            agent.wait_passes(1)
            second = hostd("run", "--policy", str(POLICY), "--state-dir", str(tmp_path / "s2"),
                           "--run-dir", str(tmp_path / "r2"), "--scope-pid",
                           str(job.launcher))  # fmt: skip
            assert second.returncode == 1, second.stdout + second.stderr
            assert "another hostd agent is running" in second.stderr
            assert f"pid {agent.proc.pid}" in second.stderr
            restore = hostd("restore", "--state-dir", str(tmp_path / "s2"),
                            "--run-dir", str(tmp_path / "r2"))  # fmt: skip
            assert restore.returncode == 1 and "an agent is running" in restore.stderr
        finally:
            agent.stop()
        assert agent.proc.returncode == 0


def test_where_run_is_read_only_an_abstract_socket_holds_the_lock(tmp_path):
    """The VM tier's /run is read-only: the lock falls back to an abstract socket name."""
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=16k", "tmpfs", str(ro)], check=True)
    try:
        from hostd.statedir import lock_host

        fd = lock_host(str(ro / "hostd.lock"))
        try:
            probe = (
                "import sys\nfrom hostd.statedir import Locked, lock_host\n"
                f"try:\n    lock_host({str(ro / 'hostd.lock')!r})\nexcept Locked as e:\n"
                "    print(e.pid)\nelse:\n    print('taken')\n"
            )
            out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
            assert out.stdout.strip() == str(os.getpid()), out.stdout + out.stderr
        finally:
            os.close(fd)
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert out.stdout.strip() == "taken", out.stdout + out.stderr
    finally:
        subprocess.run(["umount", str(ro)], check=False)
