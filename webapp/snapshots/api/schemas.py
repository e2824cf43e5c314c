"""The JSON API's request and response bodies as typed schemas (contract.md §3), for the served
OpenAPI document (``/api/v1/openapi.json``).

The views build their answers with the services' dict builders and return them as they are; these
schemas say what those answers hold, and ``tests/webapp/test_api_schema.py`` validates live answers
of every route, successes and refusals, against the served document, so the two cannot drift apart.
Objects allow keys beyond those named (``extra="allow"``): the contract adds keys, never removes one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field, WithJsonSchema

# An ISO 8601 time as the API writes it (``datetime.isoformat()``).
Timestamp = Annotated[str, Field(description="ISO 8601 time")]
# A multipart file part: bytes on the wire, ``string``/``binary`` in OpenAPI.
BinaryFile = Annotated[bytes, WithJsonSchema({"type": "string", "format": "binary"})]


class Open(Schema):
    """An object that may carry keys beyond those named (later issues add keys)."""

    model_config = ConfigDict(extra="allow")


# --- errors ---------------------------------------------------------------------------------


class ErrorDetail(Schema):
    code: str = Field(description="a stable code: auth-required, not-found, upload:quota-exceeded, ...")
    message: str = Field(description="what happened and what to do, in a sentence")
    choices: list[str] | None = Field(
        None, description="the values that would do: projects to upload to, or change ids"
    )


class Error(Schema):
    """Every API refusal: ``{"error": {"code", "message"}}`` (contract.md §3)."""

    error: ErrorDetail


# --- uploads --------------------------------------------------------------------------------


class UploadForm(Schema):
    """``POST /api/v1/snapshots``, multipart (the upload page's fields; contract.md §3)."""

    file: BinaryFile = Field(
        description="the snapshot (.pickle, .pickle.gz, .json, .pt), or a tar/zip of a run's ranks"
    )
    project: str | None = Field(None, description="a project slug; default: the token's project")
    run: str | None = Field(None, max_length=200)
    tags: str | None = Field(None, max_length=500, description="comma-separated")
    note: str | None = Field(None, max_length=5000)
    oom_message: str | None = Field(None, description="torch's OOM message: the real limit")
    batch_size: int | None = Field(None, ge=1)
    cap: str | None = Field(None, description='the memory the run was allowed: bytes or "7GiB"')
    rank: int | None = Field(None, ge=0)
    world_size: int | None = Field(None, ge=1)
    local_rank: int | None = Field(None, ge=0)
    commit: str | None = Field(None, max_length=64)
    branch: str | None = Field(None, max_length=200)
    host: str | None = Field(None, max_length=200)
    torch_version: str | None = Field(None, max_length=50)
    job_id: str | None = Field(None, max_length=200)
    error: str | None = Field(None, max_length=5000, description="the error the rank died of when not an OOM")
    follows: str | None = Field(None, description="the code of the upload this run reruns; none: not a follow-up")
    changed: list[str] | None = Field(None, description="change ids (analysis.followup.DECLARABLE)")


class UploadAccepted(Open):
    """202 (200 for an ``Idempotency-Key`` replay): the new upload's row."""

    id: str
    status: str
    url: str
    api_url: str
    progress: int
    publish: Literal["pending"] | None = Field(None, description="the broker was down: queued by the sweep")
    note: str | None = None


class UploadError(Schema):
    code: str
    message: str | None


class PeakLedgerRow(Open):
    id: str | None
    label: str | None
    bytes: int | None
    source: str | None


class Ledger(Open):
    moment: str | None
    event_index: int | None
    total_bytes: int | None
    rows: list[PeakLedgerRow]


class Summary(Open):
    """The few figures kept on the row (``jobs.summary_from_report``); ``{devices: 0}`` alone
    for a report without devices."""

    devices: int
    peak_reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    device: int | str | None = None
    events: int | None = None
    oom: bool | None = None
    verdict: str | None = None
    suggestions: int | None = None
    limit_bytes: int | None = None
    limit_text: str | None = None
    limit_source: str | None = None
    verdict_level: str | None = None
    headline: str | None = None
    change_id: str | None = None
    change_title: str | None = None
    top_suggestion: str | None = None
    edge_of_cap: str | None = None
    ledger: Ledger | None = None


class Applied(Open):
    id: str
    label: str | None = None
    source: str | None = None


class Follows(Open):
    """What this upload follows (issue 33): the incident and the scored outcome."""

    code: str
    url: str
    source: str | None
    changes_declared: list[str]
    advised_change: str | None
    followed: bool | None
    applied: list[Applied]
    scored_change: str | None
    predicted: dict[str, Any] | None
    actual: dict[str, Any] | None
    incident_oom_step: int | None
    outcome: str | None
    text: str


class Parts(Schema):
    """Which parts of the outcome are stored (issue 34: the report first, then the charts and stores)."""

    report: bool
    charts: bool
    stores: bool


class Upload(Open):
    """``GET /api/v1/snapshots/<id>``: one upload (``payloads.upload_api_dict``)."""

    id: str
    status: Literal["queued", "running", "done", "failed"]
    progress: int
    stage: str
    error: UploadError | None
    url: str
    api_url: str
    share_url: str | None
    shared: bool
    project: str
    run: str
    tags: list[str]
    filename: str
    bytes: int
    sha256: str
    created_at: Timestamp
    summary: Summary | None
    follows: Follows | None
    parts: Parts | None = None
    coming: list[str] | None = Field(None, description="what is still coming after the first answer")
    remaining_s: int | None = Field(None, description="about how long the rest takes, from the site's rates")


class Deleted(Schema):
    id: str
    deleted: Literal[True]


class Report(Open):
    """The report JSON (contract.md §2, ``oomscope.report/1``)."""

    schema_: str = Field(alias="schema", description="oomscope.report/1")
    devices: list[dict[str, Any]]


class ShareLink(Schema):
    key: str
    name: str
    url: str | None
    active: bool
    created_at: Timestamp
    created_by: str | None
    use_count: int
    last_used_at: Timestamp | None
    revoked_at: Timestamp | None


class ShareForm(Schema):
    name: str | None = Field(None, description="a name for the new link")


class ShareList(Schema):
    share_url: str | None
    links: list[ShareLink]


class ShareMade(Schema):
    share_url: str
    markdown: str
    link: ShareLink


class ShareRevoked(Schema):
    share_url: str | None
    revoked: int


class FollowsForm(Schema):
    follows: str | None = Field(None, description="an upload's code, or none")
    changed: list[str] | None = Field(None, description="change ids, repeated or comma-separated")


class FollowedBy(Schema):
    code: str
    url: str
    outcome: str | None
    text: str


class FollowsAnswer(Schema):
    id: str
    follows: Follows | None
    followed_by: list[FollowedBy]


# --- projects -------------------------------------------------------------------------------


class Project(Schema):
    slug: str
    name: str
    team: str


class ProjectList(Schema):
    projects: list[Project]


class ProjectHistory(Schema):
    project: Project
    runs: list[Upload]


class AdviceRow(Open):
    change: str
    label: str
    advised: int
    followed: int
    tried: int
    borne_out: int
    refuted: int
    postponed: int
    not_applied: int
    unknown: int


class ProjectAdvice(Schema):
    project: Project
    changes: list[AdviceRow]


class SiteAdvice(Schema):
    changes: list[AdviceRow]


# --- runs -----------------------------------------------------------------------------------


class PeakDelta(Schema):
    name: str
    baseline_bytes: int | None
    run_bytes: int | None
    delta_bytes: int | None
    share: float | None


class Regression(Open):
    """``oomscope.regression/1``."""

    schema_: str = Field(alias="schema")
    regressed: bool
    max_regression_pct: float
    peak: list[PeakDelta]
    ranks: list[PeakDelta]
    new_oom: bool
    new_top_stack: dict[str, str | None] | None
    new_causes: list[str]
    reason: str
    headline: str


class RunRank(Schema):
    rank: int | None
    id: str
    status: str
    filename: str
    url: str
    api_url: str | None
    error: UploadError | None


class Run(Open):
    """A run of one or more ranks (``runs.run_dict``); ``uploads`` only where it is one run."""

    id: str
    project: str
    name: str
    status: Literal["collecting", "analysing", "done"]
    commit: str
    branch: str
    host: str
    torch_version: str
    job_id: str
    world_size: int | None
    tags: list[str]
    created_at: Timestamp
    finished_at: Timestamp | None
    url: str
    api_url: str | None
    peak_reserved_bytes: int | None
    first_oom_rank: int | None
    oom: bool
    imbalance: float | None
    summary: dict[str, Any] | None = Field(description="oomscope.run/1 without per-rank reports")
    regression: Regression | None
    regressed: bool
    uploads: list[RunRank] | None = None


class RunAccepted(Schema):
    """202 for an archive of a run's ranks: the run as ``GET /api/v1/runs/<id>`` gives it."""

    run: Run


class RunAnalysing(Schema):
    id: str
    status: Literal["analysing"]


class Policy(Schema):
    baseline: Literal["pinned", "latest-main"]
    baseline_run: str | None
    baseline_run_name: str | None
    main_branch: str
    max_regression_pct: float
    webhook_url: str
    webhook_secret: str | None = Field(description="team admins only (not through a token of one project)")
    retention_days: int | None


class PolicyOnly(Schema):
    policy: Policy


class Delivery(Schema):
    run: str
    run_code: str
    url: str
    attempts: int
    status_code: int | None
    error: str
    created_at: Timestamp
    delivered_at: Timestamp | None
    state: Literal["delivered", "failed", "pending"]


class PolicyChange(Schema):
    at: Timestamp
    user: str | None
    token: str | None
    what: str


class PolicyAnswer(Schema):
    policy: Policy
    deliveries: list[Delivery]
    changes: list[PolicyChange]
    warnings: list[str] | None = Field(None, description="why the webhook's link is relative (SITE_URL unset)")


class PolicyForm(Schema):
    max_regression_pct: float | None = Field(None, ge=0, le=1000)
    main_branch: str | None = None
    webhook_url: str | None = Field(None, description="https URL of a public host, or empty to remove")
    retention_days: int | None = Field(None, ge=1)


class WebhookTest(Schema):
    delivered: bool
    status: int | None
    error: str


class RunList(Schema):
    project: Project
    runs: list[Run]


class RegressionAnswer(Schema):
    """The gate's question (``oomscope_client check``)."""

    status: Literal["no-run", "pending", "done"]
    run: Run | None
    baseline: Run | None = None
    regression: Regression | None = None
    regressed: bool | None
    reason: str


# --- triage ---------------------------------------------------------------------------------


class TriageRequest(Schema):
    oom_message: str = Field(description="torch's OOM message (at most 65,536 characters)")
    memory_summary: str | None = Field(None, description="torch.cuda.memory_summary()'s output")


class Triage(Open):
    """``oomscope.triage/1`` (contract.md §4) and the device's ``ledger``."""

    schema_: str = Field(alias="schema")
    cause: str
    certain: bool
    headline: str
    change: str
    findings: list[dict[str, Any]]
    ledger: dict[str, Any] | None
