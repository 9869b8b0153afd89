"""The shipped systemd units and timers pass `systemd-analyze verify` (with this virtualenv's python in
place of /srv/diagnosis/app/.venv/bin/python), and each scheduled unit runs a management command that
exists. No systemd needs to run: verify only parses and resolves the files."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from django.core.management import get_commands

from tests.config.support import DEPLOY

SYSTEMD = DEPLOY / "systemd"
VENV_PYTHON = "/srv/diagnosis/app/.venv/bin/python"


def test_the_units_and_timers_are_valid_and_name_real_commands(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    files = []
    for unit in sorted(SYSTEMD.iterdir()):
        text = unit.read_text().replace(VENV_PYTHON, sys.executable)
        # A template is verified as one of its instances.
        name = unit.name.replace("@.service", "@8001.service")
        (tmp_path / name).write_text(text)
        files.append(str(tmp_path / name))
        for command in re.findall(r"^ExecStart=\S+ manage\.py (\S+)", text, re.MULTILINE):
            assert command in get_commands(), f"{unit.name} runs an unknown command {command!r}"
    assert len(files) == 9  # the service, its target, the evaluations worker, three timers and their units
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *files], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    # Each timer starts the service of its name.
    timers = sorted(p.stem for p in SYSTEMD.glob("*.timer"))
    assert timers == ["diagnosis-purge-reasoning", "diagnosis-verify-audit", "diagnosis-verify-audit-all"]
    assert all((SYSTEMD / f"{name}.service").exists() for name in timers)
