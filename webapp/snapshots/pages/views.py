"""Pages (see the table in docs/architecture.md) and sign-up; /healthz is webapp/health.py.

Each view: login required -> look the object up through services (another team's
object is a 404) -> form -> one service call -> redirect or render plain dicts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from analysis import contract, readout
from analysis.stored import load
from webapp.snapshots import messages
from webapp.snapshots.errors import ExploreError, FieldsInvalid, LimitExceeded, ProjectRefused, TeamError
from webapp.snapshots.intake import accept, blobs, disk, intake
from webapp.snapshots.intake.forms import SignupForm, UploadForm, clean_oom_message
from webapp.snapshots.models import Invitation, Run, Upload
from webapp.snapshots.pages import chartpage, digging, firstanswer, formatting, payloads, waiting
from webapp.snapshots.runs import followups, runs
from webapp.snapshots.teams import access, membership, shares
from webapp.snapshots.teams import tokens as api_tokens

log = logging.getLogger(__name__)


def _wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "") or (
        request.headers.get("X-Requested-With") == "XMLHttpRequest"
    )


def _upload_or_404(request: HttpRequest, code: str) -> Upload:
    upload = access.upload_for_user(request.user, code)
    if upload is None:
        raise Http404
    return upload


def _report_context(request: HttpRequest, upload: Upload, *, shared: bool) -> dict[str, Any]:
    # Done: the report and its charts; running: its first answer once stored, charts still coming.
    report = firstanswer.report_for(upload)
    # Members see every link of the upload (any of them may have made it); a share-link reader none.
    can_write = not shared and access.can(request.user, upload.project.team, "write")
    links = shares.share_links(upload, request) if can_write else []
    live = [link for link in links if link["active"]]
    share_link = next((link["url"] for link in live if link["url"]), None)
    return {
        "upload": payloads.upload_dict(upload, request),
        "report": formatting.report_for_page(report.data) if report else None,
        # The first chart in the HTML, the others from charts.json once it is drawn (chartpage.py).
        "charts": chartpage.first(report.charts) if report else {},
        "charts_src": reverse("snapshots:charts_json", args=[upload.code]),
        "shared": shared,
        "share_url": share_link,
        "share_active": bool(live),
        "share_links": links,
        "can_write": can_write,
        # Delete is offered only to who may do it (access.upload_can_delete), never to a viewer.
        "can_delete": not shared and access.upload_can_delete(request.user, upload),
        "markdown_snippet": shares.markdown_snippet(upload, share_link),
        # Where the status page polls: the member's URL, or the share link's own (share_view sets it).
        "status_url": reverse("snapshots:status_json", args=[upload.code]),
        # Where the timeline fetches zoom detail and states (share_view points it at the link).
        "explore_base": reverse("snapshots:detail", args=[upload.code]),
        # Follow-ups (issue 33): members only (a share link's reader sees no other upload).
        "followup": None if shared else followups.page_context(upload, report.data if report else None),
        # A running upload's first answer: what is still coming, and about how long (status.js follows it).
        "coming": _progress(upload) if report and upload.status == Upload.Status.RUNNING else None,
    }


def _render_upload_page(request: HttpRequest, form: UploadForm, status: int = 200) -> HttpResponse:
    projects = access.writable_projects(request.user).order_by("team__name", "name")
    return render(
        request,
        "snapshots/upload.html",
        {
            "form": form,
            "projects": [membership.project_dict(p) for p in projects],
            "max_upload_bytes": settings.UPLOAD_MAX_BYTES,
        },
        status=status,
    )


def _last_project(request: HttpRequest, choices: list[tuple[str, str]]) -> dict[str, str]:
    """The form's initial project: the one this user uploaded to last, when it is still offered."""
    last = Upload.objects.filter(uploaded_by=request.user.pk).select_related("project").order_by("-created_at").first()
    slugs = {slug for slug, _ in choices}
    return {"project": last.project.slug} if last is not None and last.project.slug in slugs else {}


def _project_choices(request: HttpRequest) -> list[tuple[str, str]]:
    # Only projects the user may upload into: a viewer's projects are not offered.
    return [
        (p.slug, f"{p.team.name} / {p.name}")
        for p in access.writable_projects(request.user).order_by("team__name", "name")
    ]


# --- pages -------------------------------------------------------------------------------


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:  # logged out: what the product is, and the log-in form
        from django.contrib.auth.forms import AuthenticationForm

        return render(request, "snapshots/welcome.html", {"form": AuthenticationForm(request)})
    teams: dict[int, dict[str, Any]] = {}
    for project in access.visible_projects(request.user).order_by("team__name", "name"):
        entry = teams.setdefault(
            project.team_id, {"name": project.team.name, "slug": project.team.slug, "projects": []}
        )
        entry["projects"].append(membership.project_dict(project))
    recent = access.visible_uploads(request.user)[:20]
    return render(
        request,
        "snapshots/home.html",
        {"teams": list(teams.values()), "recent": [payloads.upload_dict(u, request) for u in recent]},
    )


@csrf_exempt  # the size cap is checked before the body (and its CSRF token) is read
@login_required
@require_http_methods(["GET", "POST"])
def upload(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        try:
            intake.check_head(request)
        except LimitExceeded as err:
            return _upload_refused(request, err)
    return _upload_checked(request)


@csrf_protect
def _upload_checked(request: HttpRequest) -> HttpResponse:
    """The page's upload: the intake's checks (``intake.admit``), then the service stores it
    (``accept.upload_admit``), as the API does."""
    choices = _project_choices(request)
    if request.method != "POST":
        return _render_upload_page(
            request, UploadForm(project_choices=choices, initial=_last_project(request, choices))
        )
    try:
        admission = intake.admit(request, UploadForm, project_choices=choices)
        made = accept.upload_admit(admission, user=request.user, token=None)  # type: ignore[arg-type]
    except FieldsInvalid as invalid:
        form = invalid.form
        if _wants_json(request):
            text = " ".join(f"{field}: {' '.join(str(e) for e in errs)}" for field, errs in form.errors.items())
            # ``fields``: each field's messages, which the page puts beside that field (static/js/upload.js).
            fields = {field: [str(e) for e in errs] for field, errs in form.errors.items()}
            return JsonResponse({"error": {"code": "upload:invalid", "message": text, "fields": fields}}, status=400)
        return _render_upload_page(request, form, status=400)  # type: ignore[arg-type]
    except ProjectRefused as err:  # the choice list already limits this; belt and braces
        raise Http404 from err
    except LimitExceeded as err:  # the intake's refusals, a limit's, and the archive's
        return _upload_refused(request, err)
    except OSError as exc:  # no space left for the blob: the form says so, with the code
        if not disk.is_full(exc):
            raise
        return _upload_refused(request, intake.disk_full())
    if isinstance(made, Run):  # a run's ranks in one tar or zip: one upload per rank
        if _wants_json(request):
            return JsonResponse({"run": runs.run_dict(made, request)}, status=202)
        return redirect("snapshots:run", run_code=made.code)
    if _wants_json(request):
        return JsonResponse(payloads.upload_api_dict(made, request), status=202)
    return redirect("snapshots:detail", code=made.code)


def _upload_refused(request: HttpRequest, err: LimitExceeded) -> HttpResponse:
    """413/422/400 with the code: JSON for scripts and the page's XHR, the form page otherwise."""
    if _wants_json(request):
        response: HttpResponse = JsonResponse(err.as_json(), status=err.status)
    else:
        form = UploadForm(request.POST, project_choices=_project_choices(request))
        form.is_valid()
        form.errors.clear()  # only the refusal matters; the other fields may not have been read
        form.add_error("file", err.message)
        response = _render_upload_page(request, form, status=err.status)
    for name, value in err.headers().items():  # X-Error-Code, and Retry-After for rates and a full disk
        response[name] = value
    return response


@login_required
@require_GET
def detail(request: HttpRequest, code: str) -> HttpResponse:
    upload_row = _upload_or_404(request, code)
    context = _report_context(request, upload_row, shared=False)
    if context["report"] is None:
        return render(request, "snapshots/status.html", {**context, "progress": _progress(upload_row)})
    return render(request, "snapshots/report.html", context)


def _progress(upload_row: Upload) -> dict[str, Any]:
    """The status page's figures: elapsed time and the estimate, worded."""
    payload = _status_payload(upload_row)
    return {
        **payload,
        "elapsed_text": formatting.duration(payload["elapsed_s"]),
        "estimate_text": formatting.duration(payload["estimate_s"]) if payload["estimate_s"] is not None else "",
        # The stage names what runs ("reading", "replaying"); the badge already says queued/failed/done.
        "stage_text": "" if upload_row.stage in ("", upload_row.status) else upload_row.stage,
    }


def _status_payload(upload_row: Upload) -> dict[str, Any]:
    from django.utils import timezone

    end = upload_row.finished_at or timezone.now()
    return {
        "status": upload_row.status,
        "progress": upload_row.progress,
        "stage": upload_row.stage,
        # Seconds since the upload; the analysis's estimate from this site's measured rates (None while a
        # rank waits for its run's other ranks) and what the upload waits for (``waiting.py``).
        "elapsed_s": round((end - upload_row.created_at).total_seconds(), 1),
        **waiting.status_figures(upload_row),
        "error": {"code": upload_row.error_code, "message": upload_row.error_message}
        if upload_row.error_code
        else None,
        # Which parts are ready (the report first, then the charts and the digging data: issue 34).
        **firstanswer.parts(upload_row),
    }


@login_required
@require_GET
@never_cache
def status_json(request: HttpRequest, code: str) -> HttpResponse:
    return JsonResponse(_status_payload(_upload_or_404(request, code)))


@require_GET
def share_status_json(request: HttpRequest, token: str) -> HttpResponse:
    """The live status page's poll for a report reached through a share link."""
    return _shared_json(token, lambda row: JsonResponse(_status_payload(row)))


def _shared_json(token: str, answer: Callable[[Upload], HttpResponse]) -> HttpResponse:
    """``answer`` for the report a share link names, not counted as a use (its page view was);
    a JSON 404 for a dead or unknown link. Capability headers either way."""
    upload_row = shares.upload_for_share_token(token, count_use=False)
    if upload_row is None:
        # An open tab of a link revoked since says so (the same words as the 404 page), not "Not found."
        return _capability_headers(
            JsonResponse({"error": {"code": "not-found", "message": messages.SHARE_LINK_GONE}}, status=404)
        )
    return _capability_headers(answer(upload_row))


@login_required
@require_POST
def share(request: HttpRequest, code: str) -> HttpResponse:
    """Page action: POST ``action=create`` (optional ``name``) adds a link; ``action=revoke`` with
    ``key`` revokes that link, without a key every live link."""
    upload_row = _upload_or_404(request, code)
    response = redirect(reverse("snapshots:detail", args=[code]) + "#share")
    if not access.can(request.user, upload_row.project.team, "write"):
        flash.error(request, messages.SHARE_READ_ONLY)
        return response
    if request.POST.get("action") == "revoke":
        key = request.POST.get("key") or None
        if shares.share_revoke(upload_row, key) == 0 and key is not None:
            flash.error(request, messages.SHARE_UNKNOWN)
        else:
            flash.info(request, messages.SHARE_REVOKED)
    else:
        shares.share_create(upload_row, request.user, request.POST.get("name") or "")  # type: ignore[arg-type]
        flash.success(request, messages.SHARE_CREATED)
    return response


@login_required
@require_POST
def delete(request: HttpRequest, code: str) -> HttpResponse:
    """Page action: delete the snapshot, its report, share links and (after commit) its file."""
    upload_row = _upload_or_404(request, code)
    if not access.upload_can_delete(request.user, upload_row):
        return render(request, "403.html", {"reason": messages.DELETE_FORBIDDEN}, status=403)
    slug = upload_row.project.slug
    blobs.upload_delete(upload_row)
    flash.success(request, messages.SNAPSHOT_DELETED)
    return redirect("snapshots:history", slug=slug)


@login_required
@require_POST
def reanalyse_with_message(request: HttpRequest, code: str) -> HttpResponse:
    """Page action: the report's "paste the OOM message" form. A new analysis of the same file with
    the message (its real limit); the page then follows that one."""
    upload_row = _upload_or_404(request, code)
    back = redirect(reverse("snapshots:detail", args=[code]) + "#basis")
    if not access.can(request.user, upload_row.project.team, "write"):
        flash.error(request, messages.REANALYSE_READ_ONLY)
        return back
    try:
        text = clean_oom_message(request.POST.get("oom_message") or "")
    except ValidationError as err:
        flash.error(request, " ".join(err.messages))
        return back
    if not text:
        flash.error(request, messages.REANALYSE_EMPTY)
        return back
    try:
        accept.reanalysis_admit(request, upload_row, request.user)  # type: ignore[arg-type]
    except LimitExceeded as err:
        flash.error(request, err.message)
        return back
    again = accept.upload_reanalyse(upload_row, request.user, oom_message=text)  # type: ignore[arg-type]
    flash.info(request, messages.REANALYSE_QUEUED)
    return redirect("snapshots:detail", code=again.code)


@login_required
@require_POST
def followup_answer(request: HttpRequest, code: str) -> HttpResponse:
    """Page action (issue 33): "what did you change?" on a follow-up's report, or "not a follow-up"
    (``follows=none``); scored again at once."""
    upload_row = _upload_or_404(request, code)
    back = redirect(reverse("snapshots:detail", args=[code]))
    if not access.upload_can_delete(request.user, upload_row):
        flash.error(request, messages.FOLLOWS_FORBIDDEN)
        return back
    follows = request.POST.get("follows")
    try:
        changed = followups.parse_changes(request.POST.getlist("changed"))
        followups.declare(upload_row, follows.strip() if follows is not None else None, changed)
    except LimitExceeded as err:
        flash.error(request, err.message)
        return back
    flash.info(request, messages.FOLLOWS_SAVED)
    return back


def _capability_headers(response: HttpResponse) -> HttpResponse:
    """Pages reached by a secret URL must not leak it (W3C capability URLs; reliability.md §4)."""
    response["Referrer-Policy"] = "no-referrer"
    response["Cache-Control"] = "private, no-store"
    response["X-Robots-Tag"] = "noindex, nofollow"
    return response


@require_GET
def share_view(request: HttpRequest, token: str) -> HttpResponse:
    upload_row = shares.upload_for_share_token(token)
    if upload_row is None:
        return _capability_headers(
            render(request, "404.html", status=404)
            if _has_404()
            else HttpResponse(messages.NOT_FOUND, status=404, content_type="text/plain")
        )
    context = _report_context(request, upload_row, shared=True)
    context["share_url"] = request.build_absolute_uri()
    context["markdown_snippet"] = shares.markdown_snippet(upload_row, context["share_url"])
    context["status_url"] = reverse("snapshots:share_status_json", args=[token])
    context["explore_base"] = reverse("snapshots:share_view", args=[token])
    context["charts_src"] = reverse("snapshots:share_charts_json", args=[token])
    if context["report"] is None:
        context["progress"] = _progress(upload_row)
    template = "snapshots/report.html" if context["report"] is not None else "snapshots/status.html"
    return _capability_headers(render(request, template, context))


def _has_404() -> bool:
    from django.template import TemplateDoesNotExist
    from django.template.loader import get_template

    try:
        get_template("404.html")
    except TemplateDoesNotExist:
        return False
    return True


@login_required
@require_GET
def history(request: HttpRequest, slug: str) -> HttpResponse:
    project = access.project_for_user(request.user, slug)
    if project is None:
        raise Http404
    uploads = project.uploads.select_related("project", "project__team", "run_ref")[:500]
    rows = [payloads.upload_dict(u, request) for u in uploads]
    followups.add_followed_by(rows, project)  # issue 33: incidents with their follow-ups and outcomes
    return render(
        request,
        "snapshots/history.html",
        {"project": membership.project_dict(project), "rows": rows, "chart": _history_chart(rows)},
    )


def _history_chart(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    from webapp.snapshots.pages import charts  # bokeh, imported by the pages that draw

    try:
        chart: dict[str, Any] | None = charts.build_history_chart(rows)
    except Exception:
        log.exception("history chart failed")
        return None
    return chart


@login_required
@require_GET
def compare(request: HttpRequest, code_a: str, code_b: str) -> HttpResponse:
    a = _upload_or_404(request, code_a)
    b = _upload_or_404(request, code_b)
    report_a, report_b = payloads.report_for(a), payloads.report_for(b)
    # Each stored report read once, typed (analysis.stored.load), for the charts, the diff and both sides.
    typed_a = load(report_a.data) if report_a else None
    typed_b = load(report_b.data) if report_b else None
    charts: dict[str, Any] = {}
    diff = None
    if typed_a and typed_b:
        from webapp.snapshots.pages import charts as charts_module  # bokeh, imported by the pages that draw

        try:
            charts = charts_module.build_compare_charts(typed_a, typed_b)
        except Exception:
            log.exception("compare charts failed")
        from analysis.compare import compare as compare_reports

        diff = compare_reports(typed_a, typed_b)
    return render(
        request,
        "snapshots/compare.html",
        {
            "a": _compare_side(a, typed_a, request),
            "b": _compare_side(b, typed_b, request),
            "charts": charts,
            "diff": diff,
        },
    )


def _compare_side(upload_row: Upload, report: contract.Report | None, request: HttpRequest) -> dict[str, Any]:
    """One run of the compare page: its report's main device (the OOM one, else the largest, typed:
    ``analysis.contract``) with what its verdict rests on and its decision, as the report page words them."""
    device = contract.main_device(report) if report else None
    return {
        "upload": payloads.upload_dict(upload_row, request),
        "report": report,
        "device": device,
        "basis": readout.basis(device) if device else None,
        "decision": device.decision if device else None,
    }


# --- digging: zoom detail, the state at an event, one block ---------------------------------


def _int_param(request: HttpRequest, name: str, default: int | None = None) -> int:
    raw = request.GET.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ExploreError(400, "explore:missing-param", f"the query needs {name}=")
        return default
    try:
        return int(float(raw))
    except (ValueError, OverflowError) as err:  # "nan", "inf" (was an HTML 500, issue 22)
        raise ExploreError(400, "explore:bad-param", f"{name}={raw[:40]!r} is not a number") from err


def _explore_answer(upload_row: Upload, request: HttpRequest, kind: str) -> HttpResponse:
    if upload_row.status != Upload.Status.DONE:
        message = messages.REPORT_NOT_READY.format(status=upload_row.status)
        return JsonResponse({"error": {"code": "report-not-ready", "message": message}}, status=404)
    try:
        device = _int_param(request, "device", 0)
        if kind == "timeline":
            t0 = _int_param(request, "t0", 0)
            t1 = _int_param(request, "t1", 2**62)
            px = min(4000, max(16, _int_param(request, "px", 1000)))
            body = digging.timeline_payload(upload_row, device, t0, t1, px)
        elif kind == "active":
            t0 = _int_param(request, "t0", 0)
            t1 = _int_param(request, "t1", 2**62)
            px = min(4000, max(16, _int_param(request, "px", 1000)))
            body = digging.active_payload(upload_row, device, t0, t1, px)
        elif kind == "segments":
            t0 = _int_param(request, "t0", 0)
            t1 = _int_param(request, "t1", 2**62)
            px = min(4000, max(16, _int_param(request, "px", 1000)))
            body = digging.segments_payload(upload_row, device, t0, t1, px)
        elif kind == "state":
            body = digging.state_payload(upload_row, device, _int_param(request, "i"))
        elif kind == "events":
            start, count = _int_param(request, "start", 0), _int_param(request, "count", 200)
            body = digging.events_payload(upload_row, device, start, count)
        else:
            body = digging.block_payload(upload_row, device, _int_param(request, "alloc"))
    except ExploreError as err:
        return JsonResponse({"error": {"code": err.code, "message": err.message}}, status=err.status)
    response = JsonResponse(body)
    response["Cache-Control"] = "private, max-age=300"  # a finished report never changes
    return response


@login_required
@require_GET
def explore_json(request: HttpRequest, code: str, kind: str) -> HttpResponse:
    """``/s/<code>/{timeline,state,block}.json``: see webapp/snapshots/pages/digging.py."""
    return _explore_answer(_upload_or_404(request, code), request, kind)


@require_GET
def share_explore_json(request: HttpRequest, token: str, kind: str) -> HttpResponse:
    """The same through a share link (counted once per page view, not per zoom)."""
    return _shared_json(token, lambda row: _explore_answer(row, request, kind))


def _later_charts(upload_row: Upload) -> HttpResponse:
    if upload_row.status != Upload.Status.DONE:
        message = messages.REPORT_NOT_READY.format(status=upload_row.status)
        return JsonResponse({"error": {"code": "report-not-ready", "message": message}}, status=404)
    response = JsonResponse(chartpage.later(payloads.report_charts(upload_row)))
    response["Cache-Control"] = "private, max-age=300"  # a finished report never changes
    return response


@login_required
@require_GET
def charts_json(request: HttpRequest, code: str) -> HttpResponse:
    """``/s/<code>/charts.json``: the charts the page did not embed (webapp/snapshots/pages/chartpage.py)."""
    return _later_charts(_upload_or_404(request, code))


@require_GET
def share_charts_json(request: HttpRequest, token: str) -> HttpResponse:
    """The same through a share link (not counted as a use: the page view was)."""
    return _shared_json(token, _later_charts)


# --- teams, projects, API tokens ----------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def teams(request: HttpRequest) -> HttpResponse:
    """The user's teams and the invitations waiting for them. POST ``action``: ``accept`` or
    ``decline`` (``invitation``: its id); otherwise ``name`` creates a team (its creator is the owner)."""
    if request.method == "POST" and request.POST.get("action") in ("accept", "decline"):
        accept = request.POST["action"] == "accept"
        try:
            invitation_id = int(request.POST.get("invitation") or "")
        except ValueError:
            invitation_id = 0
        try:
            joined = membership.invitation_answer(request.user, invitation_id, accept)  # type: ignore[arg-type]
        except TeamError as err:
            flash.error(request, err.message)
            return redirect("snapshots:teams")
        if accept:
            flash.success(request, f"You joined {joined.name} ({joined.slug}).")
            return redirect("snapshots:team", team=joined.slug)
        flash.info(request, f"Invitation to {joined.name} ({joined.slug}) declined.")
        return redirect("snapshots:teams")
    if request.method == "POST":
        try:
            team = membership.team_create_for_user(request.user, request.POST.get("name") or "")  # type: ignore[arg-type]
        except TeamError as err:
            flash.error(request, err.message)
            return redirect("snapshots:teams")
        flash.success(request, f"Team {team.name} created.")
        return redirect("snapshots:team", team=team.slug)
    rows = [membership.team_dict(t, request.user) for t in access.visible_teams(request.user)]
    return render(
        request, "snapshots/teams.html", {"teams": rows, "invitations": membership.invitations_for(request.user)}
    )


@login_required
@require_http_methods(["GET", "POST"])
def team(request: HttpRequest, team: str) -> HttpResponse:
    """A team's members, pending invitations (to its admins) and projects. POST ``action``:
    ``invite`` (``who``: username or email, ``role``: an invitation, or a member's new role),
    ``cancel_invitation`` (``username``), ``remove`` (``username``), ``create_project`` (``name``)."""
    slug = team
    team_row = access.team_for_user(request.user, slug)
    if team_row is None:
        raise Http404
    if request.method == "POST":
        action = request.POST.get("action")
        user = request.user
        try:
            if action == "invite":
                m = membership.member_invite(
                    user,  # type: ignore[arg-type]
                    team_row,
                    request.POST.get("who") or "",
                    request.POST.get("role") or "member",
                )
                if isinstance(m, Invitation):
                    # Worded from what was typed, whether or not an account has it (issue 36).
                    flash.success(request, messages.TEAM_INVITED.format(who=m.invited_as, role=m.role))
                else:
                    flash.success(request, f"{m.user.get_username()} is now {m.role} of {team_row.name}.")
            elif action == "cancel_invitation":
                membership.invitation_cancel(user, team_row, request.POST.get("username") or "")  # type: ignore[arg-type]
                flash.info(request, "Invitation withdrawn.")
            elif action == "remove":
                membership.member_remove(user, team_row, request.POST.get("username") or "")  # type: ignore[arg-type]
                flash.info(request, "Member removed.")
                if access.team_for_user(user, slug) is None:  # they left
                    return redirect("snapshots:teams")
            elif action == "create_project":
                p = membership.project_create_for_user(user, team_row, request.POST.get("name") or "")  # type: ignore[arg-type]
                flash.success(request, f"Project {p.name} created ({p.slug}).")
            else:
                flash.error(request, "Unknown action.")
        except TeamError as err:
            flash.error(request, err.message)
        return redirect("snapshots:team", team=slug)
    return render(
        request,
        "snapshots/team.html",
        {
            "team": membership.team_dict(team_row, request.user),
            "roles": list(membership.INVITABLE_ROLES),
            "advice": [
                followups.record_line(r) for r in followups.record(Upload.objects.filter(project__team=team_row))
            ],
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    """The user's API tokens. POST ``action=create`` (``name``, optional ``project`` slug) shows the
    new token once, on this response; ``action=revoke`` with ``prefix`` revokes one."""
    user = request.user
    new_token = None
    project = None
    status = 200
    if request.method == "POST":
        if request.POST.get("action") == "revoke":
            api_tokens.api_token_revoke(user, request.POST.get("prefix") or "")  # type: ignore[arg-type]
            flash.info(request, "Token revoked.")
            return redirect("snapshots:tokens")
        slug = (request.POST.get("project") or "").strip()
        project = access.project_for_user(user, slug) if slug else None
        if slug and project is None:
            flash.error(request, messages.TOKEN_PROJECT_UNKNOWN.format(slug=slug))
            status = 400
        else:
            new_token = api_tokens.api_token_create(
                user,  # type: ignore[arg-type]
                project=project,
                name=request.POST.get("name") or "",
                scope="gate" if request.POST.get("scope") == "gate" else "full",
            )
    projects = access.visible_projects(user).order_by("team__name", "name")
    writable = [p.slug for p in access.writable_projects(user).order_by("team__name", "name")]
    response = render(
        request,
        "snapshots/tokens.html",
        {
            "tokens": api_tokens.api_tokens_of(user),  # type: ignore[arg-type]
            "projects": [membership.project_dict(p) for p in projects],
            "new_token": new_token,
            "api_base": request.build_absolute_uri("/").rstrip("/"),
            # The command names a project, so it works for anyone with several (upload:no-project):
            # the token's own, else the first one the user may upload to; the others are listed.
            "command_project": project.slug if new_token and project else (writable[0] if writable else "PROJECT"),
            "other_projects": [] if new_token and project else writable[1:],
        },
        status=status,
    )
    if new_token:
        response["Cache-Control"] = "no-store"  # the page holds a secret shown once
    return response


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("snapshots:home")
    form = SignupForm(request.POST or None)
    if request.method == "POST":
        from webapp.snapshots.intake.ratelimits import check_signup_rate

        try:
            check_signup_rate(request)  # each account brings a team with its own quota
        except LimitExceeded as err:
            form.errors.clear()
            form.add_error(None, err.message)
            response = render(request, "registration/signup.html", {"form": form}, status=err.status)
            for name, value in err.headers().items():
                response[name] = value
            return response
    if request.method == "POST" and form.is_valid():
        user = form.save()
        membership.personal_team_create(user)
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("snapshots:home")
    return render(request, "registration/signup.html", {"form": form})
