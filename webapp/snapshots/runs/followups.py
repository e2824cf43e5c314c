"""Follow-up runs (issue 33): an upload that is the next run of an incident, scored against it.

- ``link`` (inside ``store.upload_create``'s transaction): ``follows=<code>`` names the incident (an
  upload of the same project); ``follows=none`` says it is none; nothing given: the newest earlier
  finished upload of the same project and run name that ran out of memory and has no follow-up yet is
  taken (``follows_source="auto"``; the page shows it and ``declare`` undoes it). The ranks of a run of
  several ranks (one by one, or one archive) are linked only where ``follows`` is given (a run's rank
  uploads share no name with an earlier run: a finished run's name is closed).
- ``settle_run`` (after a run of several ranks is summarised): the run is scored once, on its
  representative rank (its first OOM, else its largest peak), against the incident's: where the incident
  is a rank of a run of several ranks, that run's first OOM rank. The other ranks carry the outcome.
- ``settle`` (after an upload's report is stored): scores the upload against its incident with
  ``analysis.followup.compare`` and the follow-ups of this upload against it (an incident re-analysed).
- ``declare``: the later answer, "what did you change?" and which incident it follows (API and page).
- ``record``: per change id, how often it was advised, followed, tried, borne out, refuted, postponed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse

from analysis import followup as scoring
from analysis.stored import upgrade
from webapp.snapshots.errors import LimitExceeded
from webapp.snapshots.models import Project, Report, Upload

log = logging.getLogger(__name__)

NONE = "none"
CODE_RE = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
OUTCOMES = scoring.OUTCOMES
DECLARABLE = scoring.DECLARABLE


def refused(message: str) -> LimitExceeded:
    return LimitExceeded(400, "upload:invalid-follows", message)


def parse_changes(raw: str | Iterable[str]) -> list[str]:
    """``changed`` (comma-separated change ids, or a list) checked against ``DECLARABLE``."""
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    ids = [str(i).strip() for i in items if str(i).strip()]
    unknown = [i for i in ids if i not in DECLARABLE]
    if unknown:
        raise refused(f"unknown change {unknown[0]!r}: one of {', '.join(DECLARABLE)}")
    return list(dict.fromkeys(ids))[:10]


def incident_for(project: Project, follows: str, *, exclude: int | None = None) -> Upload | None:
    """The upload ``follows`` names in ``project``; ``refused`` when there is none."""
    if not CODE_RE.match(follows):
        raise refused(f"follows: {follows!r} is not an upload code (or 'none')")
    incident = Upload.objects.filter(project=project, code=follows).exclude(pk=exclude or 0).first()
    if incident is None:
        raise refused(f"follows: no upload {follows!r} in project {project.slug}")
    return incident


def _auto_incident(upload: Upload) -> Upload | None:
    """The newest earlier finished upload of the same project and run name that ran out of memory and
    has no follow-up yet."""
    if not upload.run:
        return None
    earlier = (
        Upload.objects.filter(project_id=upload.project_id, run=upload.run, status=Upload.Status.DONE)
        .filter(created_at__lte=upload.created_at)
        .exclude(pk=upload.pk)
        .filter(Q(run_ref__isnull=True) | Q(run_ref__world_size__isnull=True) | Q(run_ref__world_size__lte=1))
        .order_by("-created_at", "-id")
        .first()
    )
    if earlier is None or not (earlier.summary or {}).get("oom") or earlier.followups.exists():
        return None
    if earlier.sha256 == upload.sha256:  # the same file again (or its re-analysis) is no rerun
        return None
    return earlier


def link(upload: Upload, follows: str, changed: list[str], *, several_ranks: bool) -> None:
    """Set the incident ``upload`` follows (given, or by default: one process only) and the declared changes."""
    if several_ranks and (not follows or follows == NONE):
        return
    incident, source = None, ""
    if follows and follows != NONE:
        incident, source = incident_for(upload.project, follows, exclude=upload.pk), "given"
    elif not follows:
        incident, source = _auto_incident(upload), "auto"
    if incident is None and not changed:
        return
    Upload.objects.filter(pk=upload.pk).update(
        follows=incident, follows_source=source if incident else "", changes_declared=changed
    )
    upload.follows, upload.follows_source, upload.changes_declared = incident, source if incident else "", changed


def declare(upload: Upload, follows: str | None, changed: list[str] | None) -> Upload:
    """The user's answer after the upload: which incident it follows (``none`` unlinks) and what changed."""
    fields: dict[str, Any] = {}
    if follows is not None:
        incident = None if follows in ("", NONE) else incident_for(upload.project, follows, exclude=upload.pk)
        fields |= {"follows": incident, "follows_source": "given" if incident else "", "followup": None}
    if changed is not None:
        fields["changes_declared"] = changed
    if fields:
        Upload.objects.filter(pk=upload.pk).update(**fields)
    settle(upload.pk)
    return Upload.objects.select_related("project", "follows").get(pk=upload.pk)


def _several_ranks(upload: Upload) -> bool:
    return bool(upload.run_ref_id and upload.run_ref and (upload.run_ref.world_size or 1) > 1)


def _incident_rank(incident: Upload) -> Upload:
    """The upload that stands for ``incident``: itself, or, for a rank of a summarised run of several
    ranks, that run's first OOM rank (the run's incident is where it ran out first)."""
    if not _several_ranks(incident):
        return incident
    run = incident.run_ref
    first = ((run.summary or {}).get("run") or {}).get("first_oom_rank") if run is not None else None
    if run is None or first is None:
        return incident
    found = run.uploads.filter(rank=first).order_by("-created_at", "-id").first()
    return found or incident


def _score(follow_up: Upload) -> dict[str, Any] | None:
    incident = _incident_rank(follow_up.follows) if follow_up.follows is not None else None
    if incident is None:
        return None
    reports = dict(Report.objects.filter(upload__in=[incident, follow_up]).values_list("upload_id", "data"))
    if incident.pk not in reports or follow_up.pk not in reports:
        return None  # one of them is not analysed yet: scored when it is
    # In the current shape (a report stored by an older worker gets the keys it lacks).
    before, after = upgrade(reports[incident.pk]), upgrade(reports[follow_up.pk])
    result = scoring.compare(before, after, follow_up.changes_declared or [])
    return result.to_dict()


def settle(upload_id: int) -> None:
    """Score ``upload_id`` against its incident, and its own follow-ups against it; never raises (the
    report is stored already, a failed comparison is logged and left empty)."""
    rows = Upload.objects.select_related("follows", "run_ref", "follows__run_ref").filter(
        Q(pk=upload_id) | Q(follows_id=upload_id)
    )
    for row in rows:
        if _several_ranks(row):
            if row.run_ref is not None and row.run_ref.summary:  # a rank of a summarised run: scored as one
                settle_run(row.run_ref)
            continue
        try:
            result = _score(row)
        except Exception:
            log.exception("follow-up %s: comparison failed", row.code)
            result = None
        with transaction.atomic():
            Upload.objects.filter(pk=row.pk).update(followup=result)


def _representative(run: Any) -> Upload | None:
    """The rank a run of several ranks is scored on: its first OOM, else its largest peak reserved."""
    summary = run.summary or {}
    rank = (summary.get("run") or {}).get("first_oom_rank")
    if rank is None:
        ranks = summary.get("ranks") or []
        largest = max(ranks, key=lambda r: (int(r.get("peak_reserved_bytes") or 0), -int(r["rank"]))) if ranks else None
        rank = largest["rank"] if largest else None
    if rank is None:
        return None
    uploads = run.uploads.select_related("follows", "follows__run_ref").filter(rank=rank)
    found: Upload | None = uploads.order_by("-created_at", "-id").first()
    return found


def settle_run(run: Any) -> None:
    """Score a summarised run of several ranks that follows an incident (issue 33: a DDP job's rerun), and
    the runs that follow it; never raises."""
    rep = _representative(run)
    if rep is None or rep.follows_id is None:
        for later in Upload.objects.filter(follows__run_ref=run).exclude(run_ref=run).select_related("run_ref"):
            if _several_ranks(later) and later.run_ref is not None and later.run_ref.summary:
                settle_run(later.run_ref)
        return
    try:
        result = _score(rep)
    except Exception:
        log.exception("follow-up run %s: comparison failed", run.code)
        result = None
    carried = None
    if result is not None:
        carried = {
            "outcome": result.get("outcome"),
            "scored_on": rep.code,
            "text": f"The run is scored on rank {rep.rank} ({rep.code}): {result.get('text')}",
        }
    with transaction.atomic():
        Upload.objects.filter(pk=rep.pk).update(followup=result)
        run.uploads.exclude(pk=rep.pk).filter(follows__isnull=False).update(followup=carried)


# --- dicts for the API and the pages ------------------------------------------------------------


def follows_dict(upload: Upload, request: HttpRequest | None = None) -> dict[str, Any] | None:
    """The API's ``follows``: {code, url, source, advised_change, applied, predicted (with its ``horizon``),
    actual, horizon (the predicted horizon scored), outcome, text}."""
    incident = upload.follows
    if incident is None:
        return None
    url = reverse("snapshots:detail", args=[incident.code])
    result = upload.followup or {}
    return {
        "code": incident.code,
        "url": request.build_absolute_uri(url) if request is not None else url,
        "source": upload.follows_source,
        "changes_declared": list(upload.changes_declared or []),
        "advised_change": result.get("advised_change"),
        "followed": result.get("followed"),
        "applied": result.get("applied") or [],
        "scored_change": result.get("scored_change"),
        "predicted": result.get("predicted"),
        "actual": result.get("actual"),
        "incident_oom_step": result.get("incident_oom_step"),
        "horizon": result.get("horizon"),
        "outcome": result.get("outcome") if result else None,
        "text": result.get("text") if result else "Not scored yet: both runs' analyses must have finished.",
    }


def followed_by(upload: Upload) -> list[dict[str, Any]]:
    """The uploads that follow ``upload`` (newest first), with their outcome."""
    return [
        {
            "code": f.code,
            "url": reverse("snapshots:detail", args=[f.code]),
            "outcome": (f.followup or {}).get("outcome"),
            "text": (f.followup or {}).get("text") or "",
        }
        for f in upload.followups.order_by("-created_at", "-id")[:20]
    ]


def add_followed_by(rows: list[dict[str, Any]], project: Project) -> None:
    """The history's incident rows: each gets ``followed_by`` ([{code, outcome}], oldest first), so the
    project's history shows incidents with their follow-ups and outcomes, not only the other way round."""
    codes = [row["code"] for row in rows]
    after: dict[str, list[dict[str, Any]]] = {}
    found = (
        Upload.objects.filter(project=project, follows__code__in=codes)
        .order_by("created_at", "id")
        .values_list("follows__code", "code", "followup")
    )
    for incident, code, result in found:
        outcome = (result or {}).get("outcome")
        after.setdefault(incident, []).append({"code": code, "outcome": outcome, "words": _words(outcome)})
    for row in rows:
        row["followed_by"] = after.get(row["code"], [])
        row["followup_words"] = _words(row.get("followup_outcome"))


def _words(outcome: str | None) -> str:
    return OUTCOME_WORDS.get(str(outcome), "not scored yet")


def record(uploads: QuerySet[Upload]) -> list[dict[str, Any]]:
    """Per change id: ``advised`` (the incident's first change, over scored follow-ups), ``followed`` (that
    change applied), ``tried`` (applied and predicted, advised first or not), and the outcomes of those."""
    counts: dict[str, dict[str, int]] = {}

    def row(change_id: str) -> dict[str, int]:
        return counts.setdefault(change_id, dict.fromkeys(("advised", "followed", "tried", *OUTCOMES), 0))

    for stored in uploads.filter(followup__isnull=False).values_list("followup", flat=True):
        result: dict[str, Any] = stored or {}
        advised, scored = result.get("advised_change"), result.get("scored_change")
        if advised:
            row(advised)["advised"] += 1
            row(advised)["followed"] += bool(result.get("followed"))
        if scored:
            row(scored)["tried"] += 1
            row(scored)[str(result.get("outcome"))] += 1
        elif advised:  # not_applied (another change was made) or unknown (none seen or declared)
            row(advised)[str(result.get("outcome"))] += 1
    return [{"change": k, "label": DECLARABLE.get(k, k)} | v for k, v in sorted(counts.items())]


def record_line(item: dict[str, Any]) -> str:
    """``expandable_segments: advised 6, followed 4, borne out 1, postponed 3`` (zeros left out)."""
    parts = [f"{k.replace('_', ' ')} {item[k]}" for k in ("advised", "followed", "tried", *OUTCOMES) if item.get(k)]
    return f"{item['change']}: {', '.join(parts)}"


OUTCOME_WORDS = {
    "borne_out": "borne out",
    "refuted": "refuted",
    "postponed": "postponed (the same OOM later)",
    "not_applied": "not applied (another change was made)",
    "unknown": "unknown",
}


HORIZON_WORDS = {"postpones": "postpones the OOM", "steady": "fixes the run", "cannot_tell": "cannot tell"}
ANSWER_WORDS = {"runs_out": "still runs out in the failing step", "unknown": "cannot tell"}


def _horizon_line(item: dict[str, Any]) -> dict[str, Any]:
    """One change's line: kind (``postpones``, ``steady``, ``cannot_tell`` or ``runs_out``), words, text."""
    horizon = item["horizon"]
    if horizon is None:
        kind = "runs_out" if item["answer"] == "runs_out" else "cannot_tell"
        return item | {"kind": kind, "words": ANSWER_WORDS.get(item["answer"], "cannot tell"), "text": ""}
    kind = str(horizon["kind"])
    return item | {"kind": kind, "words": HORIZON_WORDS.get(kind, ""), "text": horizon["text"]}


def page_context(upload: Upload, report: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The report page's follow-up lines: what this run follows and its outcome, the runs that follow
    it, and (an OOM's ``report`` given) how long each advised change lasts; None when none of these."""
    follows = follows_dict(upload)
    after = followed_by(upload)
    lasts = [_horizon_line(item) for item in (scoring.horizons(report) if report else [])]
    if follows is None and not after and not lasts:
        return None
    if follows is not None:
        follows["outcome_words"] = OUTCOME_WORDS.get(str(follows.get("outcome")), "not scored yet")
    for item in after:
        item["outcome_words"] = OUTCOME_WORDS.get(str(item.get("outcome")), "not scored yet")
    declared = set(upload.changes_declared or [])
    choices = [{"id": k, "label": v, "checked": k in declared} for k, v in DECLARABLE.items()]
    return {"follows": follows, "followed_by": after, "choices": choices, "horizons": lasts}
