"""Drop the single-column `run_id` index of events, steps, tools and reviews: each table's unique
constraint starts with `run_id` and serves every lookup by run, so the second index only cost each
insert (and, at a million runs, about as much disk as that constraint). The state change is Django's
AlterField; the database change is the index dropped in place on both backends (SQLite's AlterField
would copy each whole table to drop one index)."""

import django.db.models.deletion
from django.db import migrations, models

# (model, table, index): the names Django gave these indexes in 0001.
INDEXES = (
    ("agentstep", "agent_step", "agent_step_run_id_d7576eb8"),
    ("runreview", "audit_run_review", "audit_run_review_run_id_ddacfd01"),
    ("toolinvocation", "tool_invocation", "tool_invocation_run_id_3e8a7179"),
    ("traceevent", "diagnosis_trace_event", "diagnosis_trace_event_run_id_7438505a"),
)
RELATED = {"agentstep": "steps", "runreview": "reviews", "toolinvocation": "tools", "traceevent": "events"}


def _drop(apps, schema_editor):
    q = schema_editor.quote_name
    for _model, table, index in INDEXES:
        on = f" ON {q(table)}" if schema_editor.connection.vendor == "mysql" else ""
        schema_editor.execute(f"DROP INDEX {q(index)}{on}")


def _create(apps, schema_editor):
    q = schema_editor.quote_name
    for _model, table, index in INDEXES:
        schema_editor.execute(f"CREATE INDEX {q(index)} ON {q(table)} ({q('run_id')})")


def _field(model: str, db_index: bool) -> migrations.AlterField:
    return migrations.AlterField(
        model_name=model,
        name="run",
        field=models.ForeignKey(
            db_column="run_id",
            db_constraint=False,
            db_index=db_index,
            on_delete=django.db.models.deletion.DO_NOTHING,
            related_name=RELATED[model],
            to="diagnosis.diagnosisrun",
            to_field="run_id",
        ),
    )


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0020_checkpoint_link"),
        ("diagnosis", "0018_run_created_at_default"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[_field(model, False) for model, _table, _index in INDEXES],
            database_operations=[migrations.RunPython(_drop, _create)],
        ),
    ]
