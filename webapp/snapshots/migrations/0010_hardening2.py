# Issue 22: the quota counts what an analysis stores (report, charts, explore stores).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("snapshots", "0009_runs"),
    ]

    operations = [
        migrations.AddField(
            model_name="upload",
            name="stored_bytes",
            field=models.BigIntegerField(default=0),
        ),
    ]
