# Encryption at rest of reasoning_content and assistant_text (issue 4).
#
# The column type stays LONGTEXT (TextField); only the Python field changes. Rows written before this
# migration hold plaintext: they are encrypted here with the newest configured key (a fresh database has
# none, and then no key is needed). `manage.py rotate_reasoning_keys` does the same later for any row.

from django.db import migrations

import reasoning.fields

BATCH = 500


def encrypt_plaintext_rows(apps, schema_editor):
    from reasoning import crypto

    connection = schema_editor.connection
    table = connection.ops.quote_name("agent_reasoning_audit")
    select = (
        f"SELECT id, reasoning_content, assistant_text FROM {table} WHERE id > %s AND ("  # noqa: S608
        "(reasoning_content IS NOT NULL AND reasoning_content NOT LIKE 'fernet:%%') OR "
        f"(assistant_text IS NOT NULL AND assistant_text NOT LIKE 'fernet:%%')) ORDER BY id LIMIT {BATCH}"
    )
    update = f"UPDATE {table} SET reasoning_content = %s, assistant_text = %s WHERE id = %s"  # noqa: S608
    last = 0
    keyring = None
    while True:
        with connection.cursor() as cursor:
            cursor.execute(select, [last])
            rows = cursor.fetchall()
        if not rows:
            return
        keyring = keyring or crypto.keyring()
        with connection.cursor() as cursor:
            for pk, reasoning, assistant in rows:
                last = pk
                cursor.execute(
                    update,
                    [
                        _encrypt(keyring, reasoning),
                        _encrypt(keyring, assistant),
                        pk,
                    ],
                )


def _encrypt(keyring, value):
    if value is None or value.startswith("fernet:"):
        return value
    return keyring.encrypt(value)


class Migration(migrations.Migration):
    dependencies = [
        ("reasoning", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="agentreasoningaudit",
            name="reasoning_content",
            field=reasoning.fields.EncryptedTextField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="agentreasoningaudit",
            name="assistant_text",
            field=reasoning.fields.EncryptedTextField(blank=True, null=True),
        ),
        migrations.RunPython(encrypt_plaintext_rows, migrations.RunPython.noop, elidable=True),
    ]
