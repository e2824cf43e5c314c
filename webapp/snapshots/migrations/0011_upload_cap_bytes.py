# Issue 20: the memory cap given with an upload (form, API, client --cap), the report's limit.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("snapshots", "0010_hardening2"),
    ]

    operations = [
        migrations.AddField(
            model_name="upload",
            name="cap_bytes",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
    ]
