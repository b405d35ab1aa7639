"""The layers of DESIGN.md, as a contract: import-linter checks ``[tool.importlinter]`` in
pyproject.toml (the pure core never imports the kernel door, a reader, an actuator or ctypes;
imports run down the layers, never up). A new import that breaks a layer fails here, naming the
import chain."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from importlinter import cli as importlinter

REPO = Path(__file__).resolve().parents[2]


def test_the_import_contracts_hold(capsys):
    cwd = os.getcwd()
    os.chdir(REPO)  # import-linter reads pyproject.toml from the working directory
    try:
        status = importlinter.lint_imports(
            config_filename=str(REPO / "pyproject.toml"), no_cache=True
        )
    finally:
        os.chdir(cwd)
    report = capsys.readouterr().out
    assert status == 0, report
    assert "5 kept, 0 broken" in report


KERNEL_TREES = ("proc/", "sys/", "/proc/", "/sys/", "dev/cpu_dma_latency", "boot/config")


def _kernel_paths(source: str) -> list[tuple[int, str]]:
    """String literals (f-strings' constant parts included) that start like a kernel file's
    path; docstrings and messages (text with spaces) are prose and are left out."""
    tree = ast.parse(source)
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    docs |= parts  # an f-string is judged once, by its start
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            text = first.value if isinstance(first, ast.Constant) else ""
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in docs:
                continue
            text = node.value
        else:
            continue
        if text.startswith(KERNEL_TREES) and not any(c.isspace() for c in text):
            found.append((node.lineno, text))
    return found


def test_every_kernel_path_is_named_in_host_paths():
    """README and DESIGN.md say each kernel file's path lives in ``hostd/host/paths.py``: no
    other module spells one out (a log line that mentions /proc in its middle is prose)."""
    offenders = []
    for path in sorted((REPO / "hostd").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "hostd/host/paths.py":
            continue
        offenders += [f"{rel}:{n}: {text!r}" for n, text in _kernel_paths(path.read_text())]
    assert offenders == []


def test_the_path_check_finds_what_it_looks_for():
    src = "\n".join(
        [
            '"""proc/ in a docstring"""',
            'X = "proc/1/stat"',
            'y = f"sys/devices/{n}/x"',
            'z = f"{a}/b"',
            'm = "/proc/irq is read-only"',
        ]
    )
    assert _kernel_paths(src) == [(2, "proc/1/stat"), (3, "sys/devices/")]


MAX_LINES = 450  # a module a newcomer reads in one sitting (issue 45); a bigger one is split


def test_no_module_is_over_450_lines():
    big = {
        str(path.relative_to(REPO)): n
        for path in sorted((REPO / "hostd").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert big == {}, f"split these along their seams (DESIGN.md): {big}"
