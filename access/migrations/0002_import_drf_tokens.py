"""Existing DRF `authtoken` keys become hashed `ApiToken`s, and their plaintext is erased.

`rest_framework.authtoken` is no longer installed; on a database that still has its table
`authtoken_token`, each key is stored as its digest (`imported`, expiring `API_TOKEN_TTL_HOURS` from
now, so scripts keep working until then) and the table is emptied: no plaintext key stays readable. The
empty table can be dropped afterwards (docs/security.md). A fresh database has no such table: no-op.
"""

import datetime as dt

from django.conf import settings
from django.db import migrations
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from access.tokens import digest_of, prefix_of

LEGACY_TABLE = "authtoken_token"


def import_drf_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if LEGACY_TABLE not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("access", "ApiToken")
    now = timezone.now()
    expires = now + dt.timedelta(hours=settings.API_TOKEN_TTL_HOURS)
    quoted = schema_editor.quote_name(LEGACY_TABLE)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {schema_editor.quote_name('key')}, user_id, created FROM {quoted}")  # noqa: S608
        legacy = cursor.fetchall()
    for key, user_id, created in legacy:
        if isinstance(created, str):  # SQLite's raw cursor returns text
            created = parse_datetime(created)
        if created is not None and timezone.is_naive(created):
            created = created.replace(tzinfo=dt.UTC)
        ApiToken.objects.create(
            user_id=user_id,
            name="imported DRF token",
            prefix=prefix_of(key),
            digest=digest_of(key),
            imported=True,
            created_at=created or now,
            expires_at=expires,
        )
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {quoted}")  # noqa: S608


class Migration(migrations.Migration):
    dependencies = [("access", "0001_initial")]

    operations = [migrations.RunPython(import_drf_tokens, migrations.RunPython.noop)]
