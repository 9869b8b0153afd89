"""`manage.py generate_references [--check]`: rewrite every file generated from a declaration, or (with
`--check`) name the ones that drifted from it and exit 1: the OpenAPI snapshot
(`tests/surfaces/api/data/openapi_schema.json`), docs/architecture.md's event table (`audit.events`) and
docs/configuration.md's settings tables (`core/settings_spec.py`; `python -m core.settings_doc --write
docs/configuration.md` does that one without Django). After changing a declaration (an event type, a
serializer, a setting) run it once and review the diff; the tests run the check."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from core.env import BASE_DIR

ROOT = Path(BASE_DIR)
SCHEMA_SNAPSHOT = ROOT / "tests" / "surfaces" / "api" / "data" / "openapi_schema.json"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"


def openapi_schema(_current: str) -> str:
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer

    schema = SchemaGenerator().get_schema(request=None, public=True)
    served = json.loads(OpenApiJsonRenderer().render(schema, renderer_context={}))
    return json.dumps(served, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def architecture_event_table(current: str) -> str:
    """The doc with its event table (from its header row to the first line that is not a table row)
    replaced by the registry's."""
    from audit.events import markdown_table

    table = markdown_table().split("\n")
    lines = current.split("\n")
    start = lines.index(table[0])
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:start] + table + lines[end:])


def configuration_tables(current: str) -> str:
    """The doc with its generated part (between its markers) rewritten from the settings' declaration."""
    from core.settings_doc import with_table

    return with_table(current)


GENERATED: list[tuple[Path, Callable[[str], str]]] = [
    (SCHEMA_SNAPSHOT, openapi_schema),
    (ARCHITECTURE, architecture_event_table),
    (CONFIGURATION, configuration_tables),
]


def stale() -> list[str]:
    """The generated files that differ from what their declarations produce (paths from the root)."""
    return [
        str(path.relative_to(ROOT))
        for path, produce in GENERATED
        if produce(current := path.read_text(encoding="utf-8")) != current
    ]


class Command(BaseCommand):
    help = "Rewrite the files generated from declarations; --check only names the ones that drifted."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 when a file drifted.")

    def handle(self, *args, **options) -> None:
        if options["check"]:
            drifted = stale()
            if drifted:
                raise CommandError(
                    "generated from declarations but out of date: "
                    + ", ".join(drifted)
                    + " (run `manage.py generate_references`)"
                )
            self.stdout.write("every generated file is current")
            return
        for path, produce in GENERATED:
            current = path.read_text(encoding="utf-8")
            wanted = produce(current)
            if wanted != current:
                path.write_text(wanted, encoding="utf-8")
                self.stdout.write(f"rewrote {path.relative_to(ROOT)}")
