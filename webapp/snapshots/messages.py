"""Every sentence the site shows a user about an upload or a request lives here.

Codes come from ``analysis.errors`` (``snapshot:<area>:<reason>``) or from the web app
(``upload:*``, ``worker:*``). A code without its own sentence falls back to its area's,
followed by the library's specific detail.
"""

from __future__ import annotations

BY_AREA = {
    "format": "This file is not a snapshot we can read.",
    "unsafe": "This file asks to run code when loaded; snapshots never do, so it was refused unopened.",
    "limit": "This file is larger or more deeply nested than we accept.",
    "schema": "This file loaded, but it is not shaped like a PyTorch memory snapshot.",
    "input": "This file could not be used.",
}

BY_CODE = {
    "snapshot:format:empty": "The file is empty (0 bytes): the dump never finished (the process was killed while "
    "writing it, or the disk was full). Write it with torch.cuda.memory._dump_snapshot(path) before the process "
    "exits, or let oomscope_client.dump_on_oom() write it (atomically).",
    "snapshot:format:html": "This is an HTML page, not a snapshot. Upload the file written by "
    "torch.cuda.memory._dump_snapshot().",
    "snapshot:format:not-a-snapshot": "This is not a snapshot file. Upload the pickle written by "
    "torch.cuda.memory._dump_snapshot() (raw, gzipped, torch.save'd or JSON).",
    "upload:not-a-snapshot-json": "This JSON is not a memory snapshot. Upload the file written by "
    "torch.cuda.memory._dump_snapshot(), or its JSON form (an object with 'segments' and 'device_traces').",
    "snapshot:schema:inconsistent-trace": "This snapshot's trace contradicts itself (entries are missing or were "
    "changed), so it cannot be replayed. Dump a fresh one with torch.cuda.memory._dump_snapshot().",
    "snapshot:limit:memory": "Analysing this file needed more memory than one analysis may use.",
    "snapshot:limit:time": "Analysing this file took longer than one analysis may take.",
    "worker:killed-repeatedly": "The analysis was interrupted repeatedly (killed worker repeatedly); "
    "it will not be retried.",
    "worker:analysis-killed": "The analysis was killed from outside twice (the server may be short of "
    "memory); it will not be retried. Try again later.",
    "worker:internal": "Internal error while analysing this file. It has been logged.",
    # A run's ranks in one tar or zip (runarchive.py): each refusal, before anything is stored.
    "upload:archive-too-many-members": "This archive has more entries than a run's archive may have.",
    "upload:archive-unsafe-path": "This archive names a file outside itself (an absolute path or '..'); "
    "nothing was stored.",
    "upload:archive-link": "This archive holds a link; a run's archive holds the rank files themselves.",
    "upload:archive-special-file": "This archive holds a device or pipe; a run's archive holds only files.",
    "upload:archive-nested": "This archive holds another archive; put the rank files in one tar or zip.",
    "upload:archive-too-large": "This archive's rank files together are larger than the upload limit.",
    "upload:archive-duplicate-member": "This archive holds two rank files of the same name.",
    "upload:archive-duplicate-rank": "This archive holds two snapshots of the same rank.",
    "upload:archive-empty": "This archive holds no snapshot (.pickle, .pickle.gz, .pkl, .pt).",
    "upload:archive-not-a-snapshot": "A file in this archive is not a snapshot; nothing was stored.",
    "upload:archive-bad-sidecar": "A sidecar (.json) in this archive is not the client's JSON.",
    "upload:archive-unreadable": "This archive could not be read.",
}

UPLOAD_TOO_LARGE = "The file is larger than the {limit} upload limit."
UPLOAD_LENGTH_REQUIRED = "Send the upload with a Content-Length header (chunked request bodies are not read)."
UPLOAD_MISSING_FILE = "No file was sent. Attach the snapshot as the multipart field 'file'."
UPLOAD_UNKNOWN_PROJECT = "No project '{slug}' that you can upload to."
UPLOAD_NO_PROJECT = "Choose a project to upload to."
UPLOAD_CHOICES = "Projects you can upload to: {slugs} (send one as the field 'project', or --project SLUG)."
UPLOAD_NO_CHOICES = "You can upload to no project: ask a team's admin to make you a member, or create a team."


def upload_choices(slugs: list[str]) -> str:
    """The sentence listing the projects a refused upload could go to instead."""
    return UPLOAD_CHOICES.format(slugs=", ".join(slugs)) if slugs else UPLOAD_NO_CHOICES


UPLOAD_INVALID_FIELD = "{field}: {detail}"
AUTH_REQUIRED = "Authentication required: send 'Authorization: Bearer <token>'."
BAD_API_KEY = (
    "This API token is not valid: it is unknown, revoked or expired, or its user is inactive. "
    "Make a new one (python manage.py create_api_token USER)."
)
UPLOAD_READ_ONLY = "You can read this project but not upload to it (your role is viewer)."
SHARE_READ_ONLY = "Viewers can read this report but not make or revoke its share links."
NOT_FOUND = "Not found."
REPORT_NOT_READY = "The report is not ready (status: {status})."
CSRF_FAILED = "CSRF check failed; reload the page and try again."
METHOD_NOT_ALLOWED = "Use {methods}."
SHARE_CREATED = "Share link created. Anyone with the link can read this report."
SHARE_REVOKED = "Share link revoked."
SHARE_LINK_GONE = (
    "This share link no longer works: the team that made it revoked it (or it never existed). "
    "Ask whoever sent it for a new one."
)
# Quotas, rate limits, input limits, broker outages (issue 11).
RATE_LIMITED = "Too many {what}: at most {count} per {seconds} s. Try again in {wait} s."
ANALYSIS_TOO_COSTLY = (
    "This file would take {cost} to analyse (its size, or the uncompressed size it declares), more than "
    "a team may have queued ({limit}, ANALYSIS_MAX_QUEUED_COST_PER_TEAM)."
)
ANALYSIS_QUEUE_FULL = (
    "Your team's queued analyses already cost {queued} of {limit}, and this file would add {cost}. "
    "Try again when some of them have finished."
)
QUOTA_EXCEEDED = (
    "Your team's storage quota is full: {used} of {quota} used, and this file is {size}. "
    "Delete old snapshots to make room."
)
UPLOAD_BAD_REQUEST = "The upload request could not be read: {detail}."
IDEMPOTENCY_CONFLICT = "This Idempotency-Key was already used for a different file ({code})."
IDEMPOTENCY_BAD_KEY = "An Idempotency-Key is 1 to {limit} visible ASCII characters."
PUBLISH_PENDING = (
    "Stored, but the job queue is unreachable; the upload stays queued and is sent to a worker "
    "automatically when the queue is back (within {seconds} s)."
)
DISK_FULL = "The server's disk is nearly full, so uploads are paused for now. Try again later; nothing was stored."
SNAPSHOT_DELETED = "Snapshot deleted."
DATABASE_UNAVAILABLE = "The database is unavailable for a moment; retry shortly (with the same Idempotency-Key)."
DELETE_FORBIDDEN = (
    "Only the person who uploaded a snapshot (while they may upload), or an admin of its team, may delete it."
)
EXPLORE_NO_STORE = (
    "This report keeps no zoom or digging data: it was analysed before the site stored it, or the "
    "snapshot has no trace to replay. Upload the snapshot again to dig into it."
)
EXPLORE_STORE_TOO_LARGE = (
    "This report's zoom and digging data is larger than the site serves (EXPLORE_MAX_STORE_BYTES); "
    "the report itself is complete."
)
EXPLORE_BUSY = "The site is reading other reports' zoom data right now; retry in a few seconds."
SHARE_UNKNOWN = "No live share link with that key: it was revoked already, or belongs to another report."


def error_message(code: str, detail: str = "") -> str:
    """The sentence stored with a failed upload; the library's detail follows the general one."""
    if code in BY_CODE:
        base = BY_CODE[code]
    else:
        parts = code.split(":")
        base = BY_AREA.get(parts[1] if len(parts) > 2 and parts[0] == "snapshot" else "input", BY_AREA["input"])
    if detail and detail not in base:
        return f"{base} ({detail})"
    return base


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} bytes"


# Teams, projects and tokens (membership.TeamError codes team:<reason>).
TEAM_FORBIDDEN = "Only the team's admins can do that."
TEAM_TOO_MANY = "You own {limit} teams already, the most one person may own (TEAMS_PER_USER_MAX)."
TEAM_NAME_REQUIRED = "A team needs a name."
PROJECT_NAME_REQUIRED = "A project needs a name."
TEAM_BAD_ROLE = "Unknown role {role!r}: choose viewer, member or admin."
TEAM_NO_SUCH_USER = "No user {who!r}: give the username or email of someone who has signed up."
TEAM_NO_SUCH_INVITATION = "That invitation is not there any more (answered, or withdrawn)."
TEAM_OWNER_FIXED = "The team's owner keeps their role and cannot be removed."
TOKEN_PROJECT_UNKNOWN = "No project {slug!r} among yours."  # noqa: S105 - a message, not a secret

# Runs, baselines and regressions (issue 19; webapp/snapshots/runs/runs.py, api/runs.py, runviews.py).
RUN_FORBIDDEN = "Your role in this team does not allow that (viewers read; admins manage webhooks and retention)."
RUN_NONE = "This project has no run yet (an upload with a run name makes one)."
RUN_UNKNOWN = "No run named {name!r} in this project."
RUN_PENDING = "The run is not summarised yet: its ranks are still being analysed."
RUN_NO_BASELINE = "No baseline to compare with yet: pin one, or finish a run on the project's main branch."
RUN_DELETED = "Run deleted, with its snapshots and reports."
RUN_BASELINE_PINNED = "This run is now the project's baseline."
RUN_BASELINE_UNPINNED = "The baseline is the latest run on the main branch again."
RUN_POLICY_SAVED = "Regression settings saved."

# The report page's "paste the OOM message" form (issue 20).
REANALYSE_QUEUED = "Analysing the same file again with the OOM message: this report stays as it was, in the history."
REANALYSE_READ_ONLY = "Viewers can read this report but not analyse it again; ask a member of the team."
REANALYSE_EMPTY = "Paste torch's message, the lines from 'CUDA out of memory. Tried to allocate ...' on."

# Follow-ups (issue 33).
FOLLOWS_FORBIDDEN = "Only the uploader (while they may still upload) or a team admin may say what this run follows."
ADVICE_SITE_FORBIDDEN = (
    "The site's advice record is for site admins (staff), through a token not limited to one project."
)
FOLLOWS_SAVED = "Saved: the follow-up is scored again with your answer."

# Issue 36: the gate's settings, the webhook's validation and its test.
TOKEN_READ_ONLY = "This API token is a gate token: it reads (the regression gate, reports) and changes nothing."  # noqa: S105
POLICY_ADMIN_ONLY = (
    "Only the team's admins change the baseline, the threshold, the main branch, the webhook and the retention."
)
WEBHOOK_PROJECT_TOKEN = (
    "A token limited to one project cannot change the webhook or read its secret: use the page, or a token of "  # noqa: S105
    "an admin without a project."
)
WEBHOOK_NO_SITE_URL = (
    "The webhook is saved, but SITE_URL is not set, so the alert's link to the run is relative (/runs/...), "
    "which chat apps cannot open: set SITE_URL to the site's address (e.g. SITE_URL=https://oomscope.example.com)."
)
WEBHOOK_NONE = "No webhook is set for this project."
WEBHOOK_TEST_SENT = "The test alert was delivered: the receiver answered HTTP {status}."
WEBHOOK_TEST_FAILED = "The test alert was not delivered: {error}"
TEAM_INVITED = (
    "{who} is invited as {role}: if an account has that name or e-mail, they join when they accept on their Teams page."
)
RUN_FINISHED = (
    "Run {name!r} is finished and compared with its baseline: upload under a new run name (a team admin may "
    "replace a finished run's ranks)."
)
