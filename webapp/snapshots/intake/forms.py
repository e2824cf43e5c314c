"""Forms for the pages and the API's fields. Validation only; the writes are the services' (``intake.store``,
``teams.membership``, ``runs.runs``)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.forms import UserCreationForm

from webapp.snapshots.usertext import clean_line, clean_text


def split_tags(raw: str) -> list[str]:
    return [t.strip()[:50] for t in clean_line(raw).replace(";", ",").split(",") if t.strip()]


# The upload's text fields and their limits, for the page form and the API alike (one definition).
RUN_MAX_CHARS = 200
TAGS_MAX_CHARS = 500
NOTE_MAX_CHARS = 5000
PROJECT_MAX_CHARS = 60
OOM_MESSAGE_MAX_CHARS = 65536
BATCH_SIZE_MAX = 1_000_000_000
CAP_MAX_CHARS = 40
CAP_MAX_BYTES = 1 << 50  # 1 PiB: more than any GPU, so a typo in the unit is refused, not analysed
RANK_MAX = 1_000_000
# The job's metadata fields (runs.RUN_META_KEYS plus the rank), in the order the page shows them.
JOB_FIELDS = ("rank", "world_size", "local_rank", "commit", "branch", "host", "torch_version", "job_id", "error")
ERROR_MAX_CHARS = 5000


class ChangesField(forms.MultipleChoiceField):
    """``changed``: change ids from ``analysis.followup.DECLARABLE``, repeated or comma-separated."""

    widget = forms.CheckboxSelectMultiple

    def __init__(self, **kwargs: Any) -> None:
        from analysis.followup import DECLARABLE

        super().__init__(choices=list(DECLARABLE.items()), **kwargs)

    def to_python(self, value: Any) -> list[str]:
        items = super().to_python(value)
        return [part.strip() for item in items for part in item.split(",") if part.strip()]


class UploadFieldsForm(forms.Form):
    """The fields an upload carries besides the file; the API validates with this form."""

    run = forms.CharField(max_length=RUN_MAX_CHARS, required=False, help_text="A name for this run, e.g. a job id.")
    tags = forms.CharField(max_length=TAGS_MAX_CHARS, required=False, help_text="Comma-separated.")
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}), max_length=NOTE_MAX_CHARS)
    oom_message = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=OOM_MESSAGE_MAX_CHARS,
        help_text="Optional: torch's 'CUDA out of memory. Tried to allocate ...' message (the real memory limit).",
    )

    batch_size = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=BATCH_SIZE_MAX,
        help_text="Optional: the failing step's batch size, so the advice names the batch that fits.",
    )
    cap = forms.CharField(
        required=False,
        max_length=CAP_MAX_CHARS,
        help_text="Optional: the memory the run was allowed (7GiB, 80GB or bytes), for a run without an OOM too; "
        "the report is then told how close it came.",
    )

    # Follow-ups (issue 33; webapp.snapshots.runs.followups): the incident this run follows and what changed.
    follows = forms.CharField(
        max_length=40,
        required=False,
        help_text="The code of the OOM report this run follows. Empty: the last OOM of the same run name, if any; "
        "'none': not a follow-up.",
    )
    changed = ChangesField(
        required=False,
        help_text="What you changed since that run, where the snapshot cannot show it.",
    )

    # The job's metadata (issue 19; the client fills these from torchrun's/Slurm's environment and git).
    rank = forms.IntegerField(required=False, min_value=0, max_value=RANK_MAX, help_text="This process's rank.")
    world_size = forms.IntegerField(
        required=False, min_value=1, max_value=RANK_MAX + 1, help_text="How many ranks the run has."
    )
    local_rank = forms.IntegerField(required=False, min_value=0, max_value=RANK_MAX)
    commit = forms.CharField(max_length=64, required=False, help_text="The git commit the job ran.")
    branch = forms.CharField(max_length=200, required=False)
    host = forms.CharField(max_length=200, required=False)
    torch_version = forms.CharField(max_length=50, required=False)
    job_id = forms.CharField(max_length=200, required=False, help_text="The launcher's job id.")
    error = forms.CharField(
        max_length=ERROR_MAX_CHARS,
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="The error this rank died with, when it was not an out-of-memory error (a peer's failure).",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        rank, world_size = data.get("rank"), data.get("world_size")
        if rank is not None and world_size is not None and rank >= world_size:
            self.add_error("rank", f"rank {rank} is not below the world size {world_size}")
        return data

    def run_meta(self) -> dict[str, Any]:
        """The job's metadata as ``store.upload_create(run_meta=...)`` takes it (empty ones left out)."""
        return {key: self.cleaned_data[key] for key in JOB_FIELDS if self.cleaned_data.get(key) not in (None, "")}

    def job_fields(self) -> list[forms.BoundField]:
        """The job's fields, for the upload page's "The job" section."""
        return [self[name] for name in JOB_FIELDS]

    def clean_run(self) -> str:
        return clean_line(self.cleaned_data.get("run") or "")

    def clean_note(self) -> str:
        return clean_text(self.cleaned_data.get("note") or "")

    def clean_tags(self) -> list[str]:
        return split_tags(self.cleaned_data.get("tags") or "")

    def clean_oom_message(self) -> str:
        return clean_oom_message(self.cleaned_data.get("oom_message") or "")

    def clean_cap(self) -> int | None:
        from analysis.readout import parse_size

        text = (self.cleaned_data.get("cap") or "").strip()
        if not text:
            return None
        try:
            value = parse_size(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None
        if value > CAP_MAX_BYTES:
            raise forms.ValidationError(f"{text!r} is more memory than any GPU has (at most 1 PiB)", code="max_value")
        return value

    def upload_fields(self) -> dict[str, Any]:
        """The cleaned fields as ``store.upload_create`` takes them (page and API alike)."""
        data = self.cleaned_data
        fields = {name: data[name] for name in ("run", "tags", "note", "oom_message", "batch_size")}
        follow_up = {"follows": (data.get("follows") or "").strip(), "changed": list(data.get("changed") or [])}
        return fields | {"cap_bytes": data.get("cap")} | follow_up


def clean_oom_message(text: str) -> str:
    """The pasted OOM message, refused here (not in the worker) when it is not one."""
    from analysis.limits import OomMessageError, parse_oom_message

    if not text.strip():
        return ""
    try:
        parse_oom_message(text)
    except OomMessageError as exc:
        raise forms.ValidationError(exc.message, code=exc.code) from None
    return text


class ApiUploadFieldsForm(UploadFieldsForm):
    project = forms.CharField(max_length=PROJECT_MAX_CHARS, required=False)


def first_error(form: forms.Form) -> tuple[str, str]:
    """(field, message) of a form's first error, for a JSON error body."""
    field, errors = next(iter(form.errors.items()))
    return field, " ".join(str(e) for e in errors)


class UploadForm(UploadFieldsForm):
    file = forms.FileField(
        help_text="A torch.cuda.memory._dump_snapshot() pickle: raw, gzipped, torch.save'd or JSON; "
        "or one tar or zip of a run's per-rank snapshots (and their .json sidecars), made into one run.",
        widget=forms.ClearableFileInput(
            attrs={"accept": ".pickle,.pkl,.gz,.pt,.zip,.json,.tar,.tgz,.bz2,.xz,application/octet-stream"}
        ),
    )
    project = forms.ChoiceField(choices=())
    field_order = ["file", "project", "run", "follows", "changed", "tags", "note", "oom_message", "batch_size", "cap"]

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        project = self.fields["project"]
        assert isinstance(project, forms.ChoiceField)
        project.choices = project_choices
        if len(project_choices) == 1:
            self.fields["project"].initial = project_choices[0][0]


class SignupForm(UserCreationForm):  # type: ignore[type-arg]
    pass


class RunPolicyForm(forms.Form):
    """A project's regression settings (the runs page; ``PATCH /api/v1/projects/<slug>/policy``)."""

    max_regression_pct = forms.FloatField(required=False, min_value=0, max_value=1000)
    main_branch = forms.CharField(max_length=200, required=False)
    webhook_url = forms.URLField(max_length=500, required=False, assume_scheme="https")
    retention_days = forms.IntegerField(required=False, min_value=1, max_value=36500)

    def clean_webhook_url(self) -> str:
        """Checked as a delivery checks it (issue 35: a private address was saved, then refused for
        good, visible only in the worker's log): resolved once, a public address only unless the
        operator set ``WEBHOOK_ALLOW_PRIVATE_HOSTS``; the refusal says why and what to set."""
        from webapp.snapshots.runs.webhooks import WebhookError, check_destination

        url = str(self.cleaned_data.get("webhook_url") or "")
        if url:
            try:
                check_destination(url, allow_private=bool(getattr(settings, "WEBHOOK_ALLOW_PRIVATE_HOSTS", False)))
            except WebhookError as err:
                raise forms.ValidationError(str(err), code="invalid") from None
        return url

    def changes(self) -> dict[str, Any]:
        """The fields the request carried (an empty ``webhook_url`` turns the webhook off)."""
        data = self.cleaned_data
        out = {k: data[k] for k in ("max_regression_pct", "main_branch", "retention_days") if data.get(k) is not None}
        if "main_branch" in out and not out["main_branch"]:
            del out["main_branch"]
        if "webhook_url" in self.data:
            out["webhook_url"] = data.get("webhook_url") or ""
        if self.data.get("retention_days") == "":
            out["retention_days"] = None
        return out
