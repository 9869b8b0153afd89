"""Chain the rights every user and group holds now (RIGHTS_BASELINE, access.baseline) in a store that
was just upgraded to write authentication (audit.0019): the replay of authority starts from it. A no-op
on a new database. Uses the current models and settings, like audit.0019."""

from django.db import migrations


def baseline(apps, schema_editor):
    from access.baseline import record_baseline

    record_baseline()


class Migration(migrations.Migration):
    dependencies = [
        ("access", "0003_oidc_identity"),
        ("audit", "0019_adopt_records_before_write_authentication"),
    ]

    operations = [migrations.RunPython(baseline, migrations.RunPython.noop)]
