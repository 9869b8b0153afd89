"""Issue 50: plain C2SP checkpoints (no extension lines) carry their signing time and predecessor in a
signed link note beside them (`audit.transparency.note.Link`). Existing checkpoints keep their bodies
and get empty links: they carry both in their bodies and keep verifying as signed."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0019_adopt_records_before_write_authentication"),
    ]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="link",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="link_signature",
            field=models.CharField(blank=True, default="", max_length=128),
        ),
    ]
