"""``manage.py create_api_token USER [--create-user] [--team T --project P] [--days N]``: print a new API token.

Only the token's sha256 and a prefix are stored; the printed token cannot be shown again.
With ``--team``/``--project`` the user joins the team (created if missing) and the
project (created if missing) becomes the token's default upload target. With ``--days`` the
token stops working N days from now (401 ``auth-invalid-token``); without it, when revoked.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from webapp.snapshots.models import Project, Team
from webapp.snapshots.teams import membership, tokens


class Command(BaseCommand):
    help = "Create an API token for USER and print it (store it now: it is shown once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--create-user", action="store_true", help="create the user if missing")
        parser.add_argument("--team", help="team slug or name; created if missing, USER joins it")
        parser.add_argument("--project", help="project slug inside --team; created if missing")
        parser.add_argument("--days", type=float, help="the token expires this many days from now")
        parser.add_argument(
            "--scope",
            choices=("full", "gate"),
            default="full",
            help="gate: a read-only token (a CI job that asks the regression gate); full: what USER may do",
        )

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        username = options["username"]
        user = user_model.objects.filter(username=username).first()
        if user is None:
            if not options["create_user"]:
                raise CommandError(f"no user {username!r} (add --create-user to create one)")
            user = user_model.objects.create_user(username=username)  # no password: token-only
        if options["project"] and not options["team"]:
            raise CommandError("--project needs --team")
        project = None
        if options["team"]:
            team_slug = slugify(options["team"]) or "team"
            team = Team.objects.filter(slug=team_slug).first()
            if team is None:
                team = membership.team_create(name=options["team"], slug=team_slug, owner=user)
            else:
                membership.membership_add(team=team, user=user)
            if options["project"]:
                project_slug = slugify(options["project"]) or "project"
                project = Project.objects.filter(slug=project_slug).first()
                if project is None:
                    project = membership.project_create(team=team, name=options["project"], slug=project_slug)
                elif project.team_id != team.id:
                    raise CommandError(f"project {project_slug!r} belongs to another team")
        expires_at = None
        if options["days"] is not None:
            if options["days"] <= 0:
                raise CommandError("--days must be positive")
            expires_at = timezone.now() + timedelta(days=options["days"])
        self.stdout.write(
            tokens.api_token_create(user, default_project=project, expires_at=expires_at, scope=options["scope"])
        )
