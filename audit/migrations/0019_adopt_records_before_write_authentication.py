"""Adopt a store recorded before write authentication (audit.transparency.adoption): anchor what the
previous version left unanchored with leaves of before write authentication, tag the heads of the runs
still open, and chain WRITE_AUTH_STARTED. A no-op on a new database and on any store where a link
already carries a tag. It uses the current models and settings (the write and signing keys), not the
historical ones: it only makes sense at the version that introduced the tag columns."""

from django.db import migrations


def adopt(apps, schema_editor):
    from audit.transparency import adoption

    if adoption.needed():
        adoption.adopt()


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0018_write_authentication"),
        ("diagnosis", "0017_run_creation_tag"),
        ("reasoning", "0003_list_indexes"),
    ]

    operations = [migrations.RunPython(adopt, migrations.RunPython.noop)]
