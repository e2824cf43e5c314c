"""The triage from the error text alone: the page ``/triage/`` and ``POST /api/v1/triage``.

Most people who hit a CUDA OOM have its message and no snapshot. Both ways in take the message
and, optionally, ``torch.cuda.memory_summary()``'s output, and answer with ``analysis.triage``:
nothing is stored, nothing queued. The page is a form (CSRF like every page); the API takes and
returns JSON, authenticated like the rest of the API (``webapp/snapshots/api/triage.py``: a Bearer
token, or the browser's session with its CSRF token).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.http import require_http_methods

from analysis.ledger import message_ledger
from analysis.limits import MAX_MESSAGE_CHARS, OomMessageError
from analysis.memory_summary import MAX_SUMMARY_CHARS, TriageError
from analysis.readout import ledger_view
from analysis.triage import Triage, triage
from webapp.snapshots.pages.formatting import format_bytes

# The largest JSON body the API reads: both texts at their caps, escaped (a character can take six).
MAX_BODY_BYTES = 6 * (MAX_MESSAGE_CHARS + MAX_SUMMARY_CHARS) + 1024


class TriageForm(forms.Form):
    """The page's two text areas; their lengths are the parsers' own caps."""

    oom_message = forms.CharField(
        max_length=MAX_MESSAGE_CHARS,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        label="OOM message",
        help_text="torch's 'CUDA out of memory. Tried to allocate ...' message; a traceback or log around it is fine.",
    )
    memory_summary = forms.CharField(
        required=False,
        max_length=MAX_SUMMARY_CHARS,
        strip=False,
        # Unwrapped and monospaced, so the pasted table keeps its columns.
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "wrap": "off", "class": "mono"}),
        label="torch.cuda.memory_summary() (optional)",
        help_text="Printed in the except block, before the tensors are freed, it shows where the free memory lies.",
    )


def ledger_json(result: Triage) -> dict[str, Any] | None:
    """The whole device from the message's figures (``analysis.ledger.message_ledger``), the summary's
    small pool apart where it was printed at the OOM; None where the message lacks the figures."""
    ledger = message_ledger(result.message, result.summary, result.summary_timing == "at-oom")
    return ledger.to_json() if ledger is not None else None


def _figure_rows(result: Triage) -> list[dict[str, str]]:
    """The figures the verdict rests on, worded for the page's table (templates do not compute)."""
    msg = result.message

    def row(label: str, fig: Any, note: str = "") -> dict[str, str] | None:
        if fig is None:
            return None
        exact = f"{fig.value:,} bytes" if fig.exact else f"{fig.low:,} to {fig.high:,} bytes"
        # A figure the message printed keeps its text; one summed from several is worded afresh.
        text = fig.text if fig.text[:1].isdigit() and " + " not in fig.text else format_bytes(fig.value)
        return {"label": label, "text": text, "exact": exact, "note": note}

    rows = [
        row("tried to allocate", msg.tried, "the segment size the allocator wanted"),
        row("limit", msg.limit, "the per-process cap" if msg.allowed is not None else "reserved + free on the device"),
        row(
            "room under the binding limit",
            result.room,
            "the cap minus reserved" if result.binding == "per-process-cap" else "free on the device",
        ),
        row("shortfall", result.shortfall, "the request minus the room"),
        row("reserved but unallocated", result.unallocated),
        row(
            "of it usable by this request",
            result.usable_unallocated if result.usable_unallocated is not result.unallocated else None,
            "large pool, at the OOM",
        ),
        row("other processes", result.other_processes, f"{len(msg.other_processes)} on the device"),
        row("this process outside PyTorch", result.non_pytorch),
        row("device capacity", msg.total_capacity),
    ]
    return [r for r in rows if r is not None]


@login_required
@csrf_protect
@require_http_methods(["GET", "POST"])
def page(request: HttpRequest) -> HttpResponse:
    """GET: the form. POST: the form again, with the triage under it (or the text's error)."""
    form = TriageForm(request.POST if request.method == "POST" else None)
    result: Triage | None = None
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                result = triage(form.cleaned_data["oom_message"], form.cleaned_data["memory_summary"] or None)
            except OomMessageError as exc:
                form.add_error("oom_message", exc.message)
            except TriageError as exc:
                form.add_error(
                    "memory_summary" if exc.code.startswith("memory_summary") else "oom_message", exc.message
                )
        if result is None:
            status = 400
    context = {
        "form": form,
        "result": result.to_json() if result else None,
        "figure_rows": _figure_rows(result) if result else [],
        "ledger": ledger_view({"ledger": ledger_json(result)}) if result else None,
        "upload_url": reverse("snapshots:upload"),
    }
    return render(request, "snapshots/triage.html", context, status=status)
