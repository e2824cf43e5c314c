"""Forms for the pages. Validation only; writes happen in services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.forms import UserCreationForm


def split_tags(raw: str) -> list[str]:
    return [t.strip()[:50] for t in raw.replace(";", ",").split(",") if t.strip()]


# The upload's text fields and their limits, for the page form and the API alike (one definition).
RUN_MAX_CHARS = 200
TAGS_MAX_CHARS = 500
NOTE_MAX_CHARS = 5000
PROJECT_MAX_CHARS = 60
OOM_MESSAGE_MAX_CHARS = 65536
BATCH_SIZE_MAX = 1_000_000_000


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

    def clean_tags(self) -> list[str]:
        return split_tags(self.cleaned_data.get("tags") or "")

    def clean_oom_message(self) -> str:
        return clean_oom_message(self.cleaned_data.get("oom_message") or "")

    def upload_fields(self) -> dict[str, Any]:
        """The cleaned fields as ``services.upload_create`` takes them (page and API alike)."""
        data = self.cleaned_data
        return {name: data[name] for name in ("run", "tags", "note", "oom_message", "batch_size")}


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
        help_text="A torch.cuda.memory._dump_snapshot() pickle: raw, gzipped, torch.save'd or JSON.",
        widget=forms.ClearableFileInput(attrs={"accept": ".pickle,.pkl,.gz,.pt,.zip,.json,application/octet-stream"}),
    )
    project = forms.ChoiceField(choices=())
    field_order = ["file", "project", "run", "tags", "note", "oom_message", "batch_size"]

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        project = self.fields["project"]
        assert isinstance(project, forms.ChoiceField)
        project.choices = project_choices
        if len(project_choices) == 1:
            self.fields["project"].initial = project_choices[0][0]


class SignupForm(UserCreationForm):  # type: ignore[type-arg]
    pass
