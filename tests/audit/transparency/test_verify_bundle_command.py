"""The offline verifier as an installed command (issue 50, item 4): the package pyproject.toml declares
holds what `audit.verify.offline` imports, its `diagnosis-verify-bundle` entry point is that verifier,
and both the command and `python -m audit.verify_bundle` verify a real bundle from any directory with
nothing but the standard library, `cryptography` and the installed package (Python started with `-S`:
no site-packages, so no Django, no settings, no checkout on the path).

The package's files are laid out as `setuptools` lays them out for `[tool.setuptools.packages.find]`
(each included package's own modules); building it with pip takes half a minute on a loaded machine, so
that is measured once by hand (docs/audit-integrity.md, *Commands*), not in every run of the suite."""

from __future__ import annotations

import fnmatch
import io
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import cryptography
import pytest
from django.conf import settings
from django.core.management import call_command

from audit.transparency import keys, note
from tests.audit.transparency.test_bundle import anchored_run  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db
ROOT = Path(settings.BASE_DIR)
COMMAND = "diagnosis-verify-bundle"


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _install(target: Path) -> None:
    """The declared packages' modules into `target`, as the wheel holds them."""
    patterns = _project()["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = {p.split(".")[0] for p in patterns}
    for init in (i for top in sorted(tops) for i in (ROOT / top).rglob("__init__.py")):
        package = init.parent.relative_to(ROOT)
        if not any(fnmatch.fnmatch(".".join(package.parts), p) for p in patterns):
            continue
        (target / package).mkdir(parents=True, exist_ok=True)
        for module in init.parent.glob("*.py"):
            shutil.copy2(module, target / package / module.name)


def _only_cryptography(target: Path) -> None:
    """`cryptography` and what it loads (cffi), linked from this interpreter's site-packages."""
    site = Path(cryptography.__file__).parent.parent
    for entry in site.iterdir():
        if entry.name in ("cryptography", "cffi", "pycparser") or entry.name.startswith("_cffi_backend"):
            (target / entry.name).symlink_to(entry)


def _run(args: list[str], *, path: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "DATABASE", "AUDIT_", "PYTHON"))
    }
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    return subprocess.run(
        [sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_the_installed_verifier_runs_from_any_directory_with_only_cryptography(
    anchored_run,  # noqa: F811
    tmp_path,
):
    project = _project()
    assert project["project"]["scripts"][COMMAND] == "audit.verify.offline:main"
    assert project["project"]["dependencies"] == ["cryptography"]
    installed, crypto, elsewhere = tmp_path / "site", tmp_path / "crypto", tmp_path / "somewhere" / "else"
    for d in (installed, crypto, elsewhere):
        d.mkdir(parents=True)
    _install(installed)
    _only_cryptography(crypto)
    bundle_path = elsewhere / "run.json"
    call_command("export_evidence", anchored_run.run_id, "--output", str(bundle_path), stderr=io.StringIO())
    public = note.public_text(keys.current_key().public)
    path = [installed, crypto]

    no_django = _run(["-c", "import django"], path=path, cwd=elsewhere)
    assert no_django.returncode != 0 and "No module named 'django'" in no_django.stderr

    module, entry = project["project"]["scripts"][COMMAND].split(":")
    # What the script pip writes for the entry point runs: import the module, exit with main()'s status.
    script = f"import sys; from {module} import {entry}; sys.argv[0] = {COMMAND!r}; sys.exit({entry}())"
    for args in (["-m", "audit.verify_bundle"], ["-c", script]):
        done = _run([*args, bundle_path.name, "--public-key", public], path=path, cwd=elsewhere)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert f"VERIFIED run {anchored_run.run_id}" in done.stdout
    stranger = note.public_text(note.load_private(keys.generate_key_text()).public_key())
    wrong = _run(["-c", script, bundle_path.name, "--public-key", stranger], path=path, cwd=elsewhere)
    assert wrong.returncode == 1 and "NOT VERIFIED" in wrong.stdout
    usage = _run(["-c", script, "--help"], path=path, cwd=elsewhere)
    assert usage.returncode == 0 and usage.stdout.startswith(f"usage: {COMMAND} ")
