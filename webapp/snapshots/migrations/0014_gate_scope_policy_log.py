# Issue 36: a read-only (gate) scope for API tokens; who changed a project's gate, when and what; an
# invitation keeps what the admin typed and may name no account (the form no longer tells).

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("snapshots", "0013_upload_follows"),
    ]

    operations = [
        migrations.AlterField(
            model_name="invitation",
            name="user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="invitations",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="invitation",
            name="invited_as",
            field=models.CharField(blank=True, max_length=254),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="scope",
            field=models.CharField(choices=[("full", "full"), ("gate", "gate")], default="full", max_length=8),
        ),
        migrations.CreateModel(
            name="PolicyChange",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("token_prefix", models.CharField(blank=True, max_length=12)),
                ("at", models.DateTimeField(auto_now_add=True)),
                ("what", models.CharField(max_length=600)),
                (
                    "project",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="policy_changes",
                        to="snapshots.project",
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"ordering": ["-at", "-id"]},
        ),
    ]
