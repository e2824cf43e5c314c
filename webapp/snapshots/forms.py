"""Forms for the pages. Validation only; writes happen in services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.forms import UserCreationForm

# Characters a user's text never needs and an attacker uses: bidirectional overrides and isolates
# (U+202E makes "exe.txt" read "txt.exe"), the invisible marks, and the C0/C1 controls. A line
# (run name, tag) also loses CR and LF, which forge lines in logs and exports; a note keeps its
# line breaks as LF (issue 22).
_BIDI_AND_INVISIBLE = "\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff"
_CONTROLS = "".join(chr(c) for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)))
_DROP_IN_LINE = str.maketrans(dict.fromkeys(_BIDI_AND_INVISIBLE + _CONTROLS.replace("\t", "")) | {"\t": " "})
_DROP_IN_TEXT = str.maketrans(dict.fromkeys(_BIDI_AND_INVISIBLE + _CONTROLS.replace("\t", "").replace("\n", "")))


def clean_line(text: str) -> str:
    """One line of user text: no controls, no line breaks, no bidi overrides."""
    return text.translate(_DROP_IN_LINE).strip()


def clean_text(text: str) -> str:
    """Multi-line user text: line breaks kept (CR LF and CR become LF), other controls and bidi dropped."""
    return text.replace("\r\n", "\n").replace("\r", "\n").translate(_DROP_IN_TEXT)


def split_tags(raw: str) -> list[str]:
    return [t.strip()[:50] for t in clean_line(raw).replace(";", ",").split(",") if t.strip()]


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

    def clean_run(self) -> str:
        return clean_line(self.cleaned_data.get("run") or "")

    def clean_note(self) -> str:
        return clean_text(self.cleaned_data.get("note") or "")

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
