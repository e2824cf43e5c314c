"""Teams, projects, uploads and their reports, share links and API tokens.

Only the services write these rows (``teams/``, ``intake/store.py``, ``worker/jobs.py``, ``runs/``).
Public identifiers (``Upload.code``, share tokens, API tokens) are random strings; database integers
never reach a URL. Tokens are stored as sha256 hex digests plus a short prefix to recognise them by.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Team(models.Model):
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=60, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        """What a member may do (access.ROLE_RIGHTS): viewers read; members also upload and
        share; admins (and the team's creator, its owner) also manage members, projects and roles."""

        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"
        VIEWER = "viewer"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team}"


class Invitation(models.Model):
    """A pending offer of a team role to one user. Adding someone to a team takes their consent:
    until the invitee accepts, they are no member and see none of the team's projects (issue 22)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    # None: nobody has that name or e-mail; the invitation is kept all the same, so the form's answer
    # and the pending list do not tell an admin whether an account exists (issue 36).
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="invitations", null=True, blank=True
    )
    invited_as = models.CharField(max_length=254, blank=True)  # the name or e-mail the admin typed
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="invitations_sent")
    role = models.CharField(max_length=10, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="invitation_unique")]

    def __str__(self) -> str:
        return f"{self.invited_as or self.user} invited to {self.team}"


class Project(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="projects")
    name = models.CharField(max_length=100)
    # Globally unique: the API addresses a project by slug alone (/api/v1/projects/<slug>/runs).
    slug = models.SlugField(max_length=60, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Upload(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    code = models.CharField(max_length=40, unique=True)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="uploads")
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    filename = models.CharField(max_length=255)  # display only; the stored name is the hash
    bytes = models.BigIntegerField()
    # What its analysis added to the disk (report and charts JSON, explore stores); the quota counts it.
    stored_bytes = models.BigIntegerField(default=0)
    # Bytes its analysis parses, estimated at intake (cost.estimate_cost): what the team's queue holds.
    estimated_cost = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64)
    # storage key: sha256/<aa>/<hash>; empty once the file was purged (failed upload past retention)
    blob_name = models.CharField(max_length=200, blank=True)
    format = models.CharField(max_length=20, blank=True)
    run = models.CharField(max_length=200, blank=True)
    tags = models.JSONField(default=list, blank=True)
    note = models.TextField(blank=True)
    oom_message = models.TextField(blank=True)  # torch's OOM message as pasted/sent: the real limit
    batch_size = models.PositiveIntegerField(null=True, blank=True)  # the failing step's batch (batch-fit advice)
    # The memory cap the run ran under, as the user gave it (issue 20): the report's limit, source "given",
    # for a run without an OOM too (its "at the edge of the cap" finding needs one).
    cap_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    # Many ranks as one run (issue 19): the Run this upload belongs to (by ``run`` name in its
    # project), its rank there, and what the client or the form said of the job (RUN_META_KEYS).
    run_ref = models.ForeignKey("Run", on_delete=models.CASCADE, null=True, blank=True, related_name="uploads")
    rank = models.PositiveIntegerField(null=True, blank=True)
    meta = models.JSONField(default=dict, blank=True)
    # The client's Idempotency-Key header: a retried POST with the same key (same user) gets the
    # same upload back instead of a duplicate. Empty when the client sent none.
    idempotency_key = models.CharField(max_length=100, blank=True, default="")
    # The incident this upload is the next run of (issue 33; webapp.snapshots.runs.followups): given
    # (``follows=<code>``) or taken by default (the same project and run name after an OOM); the
    # changes the user said they made; the comparison with the incident once both are analysed.
    follows = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="followups")
    follows_source = models.CharField(max_length=10, blank=True, default="")  # "given" or "auto"
    changes_declared = models.JSONField(default=list, blank=True)
    followup = models.JSONField(null=True, blank=True)

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    stage = models.CharField(max_length=20, blank=True)
    progress = models.PositiveSmallIntegerField(default=0)  # percent
    attempts = models.PositiveSmallIntegerField(default=0)
    # The Celery message id that claimed the row: a redelivery of that same message (its worker
    # died) may claim the RUNNING row again at once; any other message may not.
    task_id = models.CharField(max_length=64, blank=True, default="")
    # The pool process that claimed the row (webapp.snapshots.worker.liveness): a claim whose process
    # is provably gone is re-queued when a worker starts, and a live one is never taken over.
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    error_code = models.CharField(max_length=80, blank=True)
    error_message = models.TextField(blank=True)
    summary = models.JSONField(null=True, blank=True)  # small figures for lists and history

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    queued_at = models.DateTimeField(null=True, blank=True)  # last publish, for the sweep
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # Set by store.upload_create on the returned object only (not columns): the request was a
    # replay of an earlier one with the same Idempotency-Key; the publish to the broker failed.
    replayed: bool = False
    publish_pending: bool = False

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["project", "-created_at"], name="upload_project_recent")]
        constraints = [
            models.UniqueConstraint(
                fields=["uploaded_by", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="upload_idempotency_key_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.code} ({self.status})"


class Report(models.Model):
    """The report JSON and its chart JSON; kept apart so lists never load megabytes."""

    upload = models.OneToOneField(Upload, on_delete=models.CASCADE, related_name="report")
    data = models.JSONField()
    charts = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"report of {self.upload_id}"


class ShareLink(models.Model):
    """A read-only link to one upload's report; an upload may have several, each revocable.

    The token is never stored: it is ``HMAC(SECRET_KEY, nonce)`` (shares.share_token), so the
    site can show a live link's URL again to the team, while a copy of the database alone can
    neither read nor forge one. ``token_hash`` finds the link from a URL. Links made before
    ``nonce`` existed have an empty one: they work, but their URL cannot be shown again.
    """

    upload = models.ForeignKey(Upload, on_delete=models.CASCADE, related_name="share_links")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8)
    # Public handle for listing and revoking one link (never the token, never the row id).
    key = models.CharField(max_length=16, unique=True, null=True, blank=True)
    name = models.CharField(max_length=100, blank=True)
    nonce = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    use_count = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"share {self.prefix}…"


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    name = models.CharField(max_length=100, blank=True)
    # Uploads without an explicit project go here.
    default_project = models.ForeignKey(Project, on_delete=models.SET_NULL, null=True, blank=True)
    # When set, the token reaches this project only (reads and uploads); its user's other projects
    # stay out of reach. Deleting the project deletes the token rather than widening it.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="scoped_tokens")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # None: until revoked
    # "gate": read-only (a CI job asking the regression gate; issue 36: any CI token could flip the
    # gate's answer); "full": what its user may do.
    scope = models.CharField(max_length=8, choices=[("full", "full"), ("gate", "gate")], default="full")

    def __str__(self) -> str:
        return f"token {self.prefix}…"


class Run(models.Model):
    """One training run of a project: the uploads (one per rank) that carry the same ``run`` name.

    Its ranks are analysed together (``runtasks``: a Celery chord, one task per rank, then the
    summary); ``summary`` is ``analysis.runs``' ``oomscope.run/1`` without the per-rank reports
    and ``regression`` the comparison with the project's baseline (``analysis.regression``).
    Deleting a run deletes its uploads, and with them their reports and files.
    """

    class Status(models.TextChoices):
        COLLECTING = "collecting"  # fewer ranks than its world size so far
        ANALYSING = "analysing"
        DONE = "done"

    code = models.CharField(max_length=40, unique=True)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=200)
    commit = models.CharField(max_length=64, blank=True)
    branch = models.CharField(max_length=200, blank=True)
    host = models.CharField(max_length=200, blank=True)
    torch_version = models.CharField(max_length=50, blank=True)
    job_id = models.CharField(max_length=200, blank=True)
    world_size = models.PositiveIntegerField(null=True, blank=True)
    tags = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.COLLECTING)
    summary = models.JSONField(null=True, blank=True)
    regression = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="run_unique_name")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"


class RunPolicy(models.Model):
    """A project's baseline, regression threshold, webhook and retention (one row per project)."""

    class Baseline(models.TextChoices):
        PINNED = "pinned"  # baseline_run, chosen by a member
        LATEST_MAIN = "latest-main"  # the newest finished run on main_branch before the run compared

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="run_policy")
    baseline = models.CharField(max_length=12, choices=Baseline.choices, default=Baseline.LATEST_MAIN)
    baseline_run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    main_branch = models.CharField(max_length=200, default="main")
    max_regression_pct = models.FloatField(default=5.0)
    webhook_url = models.URLField(max_length=500, blank=True)
    # Signs each webhook body (HMAC-SHA256, header X-Oomscope-Signature); shown to the project's admins.
    webhook_secret = models.CharField(max_length=64, blank=True)
    retention_days = models.PositiveIntegerField(null=True, blank=True)  # None: keep runs for ever

    def __str__(self) -> str:
        return f"run policy of {self.project.slug}"


class PolicyChange(models.Model):
    """Who changed a project's gate (baseline, threshold, main branch, webhook, retention), when, and
    what (issue 36: the gate's answer could be flipped unseen)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="policy_changes")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    token_prefix = models.CharField(max_length=12, blank=True)  # the API token used, if any
    at = models.DateTimeField(auto_now_add=True)
    what = models.CharField(max_length=600)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.project_id}: {self.what}"


class WebhookDelivery(models.Model):
    """One regression alert's delivery: every attempt updates the same row."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="webhook_deliveries")
    url = models.URLField(max_length=500)
    attempts = models.PositiveSmallIntegerField(default=0)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"webhook for {self.run_id} ({self.status_code})"
