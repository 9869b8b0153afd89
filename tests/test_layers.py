"""The package layout is the architecture (docs/architecture.md, "Layers"): every import between the
project's top-level packages points down the layers, so the folders cannot drift from the diagram.

Bottom up: `core` (plumbing, no project imports) → `diagnosis` (identity) → the record (`reasoning`,
`pricing`, `audit`, `access`, `telemetry`, in that order: the recorder writes reasoning rows and prices
runs; access governance and telemetry read and append to the record) → `agent` (the runtime) →
`surfaces` (admin, chat, APIs, commands) → `config` (settings, URLs, ASGI: imported by nobody). Checked
here: nothing below reaches up out of its layer; no two packages import each other; the record imports
no transport (no DRF, no admin: those are the surfaces'). Every import is read, at module level and
inside functions, from the source (nothing is imported).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The layer of each top-level package; an import may only name a package of the same or a lower layer.
LAYERS = {
    "core": 0,
    "diagnosis": 1,
    "reasoning": 2,
    "pricing": 3,
    "audit": 4,
    "access": 5,
    "telemetry": 6,
    "agent": 7,
    "evaluations": 7,
    "experiments": 7,
    "surfaces": 8,
    "config": 9,
}
RECORD = ("diagnosis", "reasoning", "pricing", "audit", "access", "telemetry")
TRANSPORT = ("rest_framework", "drf_spectacular", "django.contrib.admin")

# Imports that reach up on purpose, each with its reason. Keep this list short.
ALLOWED_UP = {
    # The migration that added the list facts backfilled them with the record's own rule (one home).
    ("diagnosis.migrations.0009_list_facts", "audit.read.list_facts"),
}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _violations() -> list[str]:
    found = []
    for package, layer in LAYERS.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            module = _module(path)
            for name in _imports(path):
                target = name.split(".")[0]
                if target not in LAYERS or target == package or LAYERS[target] <= layer:
                    continue
                if any(module == m and name.startswith(t) for m, t in ALLOWED_UP):
                    continue
                found.append(f"{module} imports {name} ({package} is below {target})")
    return found


def test_every_import_between_packages_points_down_the_layers():
    assert _violations() == []


def test_no_two_packages_import_each_other():
    """A two-way pair is one package in two folders: the one below must not know the one above (the
    migration allowed in `ALLOWED_UP` aside)."""
    edges: set[tuple[str, str]] = set()
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            module = _module(path)
            for name in _imports(path):
                target = name.split(".")[0]
                allowed = any(module == m and name.startswith(t) for m, t in ALLOWED_UP)
                if target in LAYERS and target != package and not allowed:
                    edges.add((package, target))
    assert sorted((a, b) for a, b in edges if (b, a) in edges) == []


def test_the_record_imports_no_transport():
    """DRF views, serializers, permissions and admin classes live under `surfaces/` (and the admin's
    read-only base in `core`); the record is reached through its services and selectors. Migrations,
    frozen history, are exempt."""
    offenders = [
        f"{_module(path)} imports {name}"
        for package in RECORD
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
        for name in _imports(path)
        if name.startswith(TRANSPORT)
    ]
    assert offenders == []


def test_nothing_imports_config_but_the_entry_points():
    """`config` is settings, URLs and ASGI: code reads settings through `django.conf.settings`."""
    offenders = [
        f"{_module(path)} imports {name}"
        for package in LAYERS
        if package != "config"
        for path in (ROOT / package).rglob("*.py")
        for name in _imports(path)
        if name.split(".")[0] == "config"
    ]
    assert offenders == []


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_package_is_on_the_map(package):
    assert (ROOT / package / "__init__.py").is_file()


def test_no_top_level_package_is_left_off_the_map():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages == set(LAYERS)
