"""The layers of DESIGN.md, as a contract: import-linter checks ``[tool.importlinter]`` in
pyproject.toml (the pure core never imports the kernel door, a reader, an actuator or ctypes;
imports run down the layers, never up). A new import that breaks a layer fails here, naming the
import chain."""

from __future__ import annotations

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
    assert "2 kept, 0 broken" in report
