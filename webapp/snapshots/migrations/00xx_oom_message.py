# The lead renumbers this migration when merging (issue 9 item 4: the pasted OOM message).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("snapshots", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="upload",
            name="oom_message",
            field=models.TextField(blank=True),
        ),
    ]
