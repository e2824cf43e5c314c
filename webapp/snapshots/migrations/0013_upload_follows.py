# Issue 33: an upload can follow an incident (an earlier upload that ran out of memory); the
# changes its user declared and the comparison of the two reports are kept on the follow-up.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("snapshots", "0012_invitations"),
    ]

    operations = [
        migrations.AddField(
            model_name="upload",
            name="follows",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="followups",
                to="snapshots.upload",
            ),
        ),
        migrations.AddField(
            model_name="upload",
            name="follows_source",
            field=models.CharField(blank=True, default="", max_length=10),
        ),
        migrations.AddField(
            model_name="upload",
            name="changes_declared",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="upload",
            name="followup",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
