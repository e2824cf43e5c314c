"""Forms for the pages. Validation only; writes happen in services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.forms import UserCreationForm


def split_tags(raw: str) -> list[str]:
    return [t.strip()[:50] for t in raw.replace(";", ",").split(",") if t.strip()]


class UploadForm(forms.Form):
    file = forms.FileField(
        help_text="A torch.cuda.memory._dump_snapshot() pickle: raw, gzipped, torch.save'd or JSON.",
        widget=forms.ClearableFileInput(attrs={"accept": ".pickle,.pkl,.gz,.pt,.zip,.json,application/octet-stream"}),
    )
    project = forms.ChoiceField(choices=())
    run = forms.CharField(max_length=200, required=False, help_text="A name for this run, e.g. a job id.")
    tags = forms.CharField(max_length=500, required=False, help_text="Comma-separated.")
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}), max_length=5000)
    oom_message = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=65536,
        help_text="Optional: torch's 'CUDA out of memory. Tried to allocate ...' message (the real memory limit).",
    )

    def __init__(self, *args: Any, project_choices: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        project = self.fields["project"]
        assert isinstance(project, forms.ChoiceField)
        project.choices = project_choices
        if len(project_choices) == 1:
            self.fields["project"].initial = project_choices[0][0]

    def clean_tags(self) -> list[str]:
        return split_tags(self.cleaned_data.get("tags") or "")

    def clean_oom_message(self) -> str:
        return clean_oom_message(self.cleaned_data.get("oom_message") or "")


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


class SignupForm(UserCreationForm):  # type: ignore[type-arg]
    pass
