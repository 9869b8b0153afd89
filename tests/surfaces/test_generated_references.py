"""Files generated from declarations stay equal to them (`manage.py generate_references`): the OpenAPI
snapshot and docs/architecture.md's event table. A change to a declaration is one command away from its
generated files; a drift fails here and names that command."""

import pytest
from django.core.management import CommandError, call_command

from surfaces.management.commands import generate_references


def test_every_generated_file_is_current(capsys):
    assert generate_references.stale() == [], "run `manage.py generate_references` and review the diff"
    call_command("generate_references", "--check")
    assert "current" in capsys.readouterr().out


def test_a_drifted_table_is_named_and_rewritten(tmp_path, monkeypatch):
    doc = tmp_path / "architecture.md"
    original = generate_references.ARCHITECTURE.read_text(encoding="utf-8")
    doc.write_text(original.replace("| `RUN_STARTED` | its recorder", "| `RUN_STARTED` | someone else"))
    monkeypatch.setattr(generate_references, "ROOT", tmp_path)
    monkeypatch.setattr(
        generate_references, "GENERATED", [(doc, generate_references.architecture_event_table)]
    )
    with pytest.raises(CommandError, match=r"architecture\.md .*generate_references"):
        call_command("generate_references", "--check")
    call_command("generate_references")
    assert doc.read_text(encoding="utf-8") == original
