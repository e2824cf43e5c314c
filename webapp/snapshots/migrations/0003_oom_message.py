# The pasted OOM message (issue 9 item 4: the real limit).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("snapshots", "0002_roles_and_token_expiry"),
    ]

    operations = [
        migrations.AddField(
            model_name="upload",
            name="oom_message",
            field=models.TextField(blank=True),
        ),
    ]
