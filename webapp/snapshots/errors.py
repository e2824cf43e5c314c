"""What a user is told when the site refuses: one root, ``UserError``, and every refusal under it.

A bottom module (it imports nothing of ours but, for types, the models): the intake, the teams, the
runs, the pages and the API raise these and answer them alike, with the HTTP ``status``, a stable
``code`` (``<area>:<reason>``, docs/contract.md) and a ``message`` for people (the words are in
``messages.py``). Not here: failures that are not the user's (a webhook that did not go through,
the analysis child's crash), which keep their own classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.forms import Form

    from webapp.snapshots.models import Upload


class UserError(Exception):
    """The root of the refusals a user sees: ``status`` (HTTP), ``code`` (stable), ``message``.

    Annotations only, no class values: ``LimitExceeded`` is a dataclass whose fields these are."""

    status: int
    code: str
    message: str

    def as_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}

    def headers(self) -> dict[str, str]:
        headers = {"X-Error-Code": self.code}
        retry_after = getattr(self, "retry_after", None)
        if retry_after:
            headers["Retry-After"] = str(retry_after)
        return headers


class ApiRefusal(UserError):
    """An API caller refused where returning is awkward (authentication, CSRF: ``api/auth.py``), answered as
    the error body with the headers it names (``WWW-Authenticate`` on a 401)."""

    def __init__(self, status: int, code: str, message: str, extra_headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.extra_headers = extra_headers or {}


@dataclass
class LimitExceeded(UserError):
    """A limit's refusal (a rate, the quota, the disk's reserve, a finished run), with the seconds
    to wait for a rate (sent as ``Retry-After``)."""

    status: int
    code: str
    message: str
    retry_after: int | None = None


class IntakeError(LimitExceeded):
    """An upload refused before it is stored: the same status, code, message and headers as a
    limit's refusal (``LimitExceeded``), raised for the body and the file as well."""


class FieldsInvalid(UserError):
    """The upload's text fields did not validate; the page renders the form, the API its first error."""

    def __init__(self, form: Form) -> None:
        super().__init__("invalid fields")
        self.status, self.code, self.message = 400, "upload:invalid", "invalid fields"
        self.form = form


class Refusal(UserError):
    """An upload refused at once, before queueing, with a stable code (the sniffer's; 422)."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(code)
        self.status, self.code, self.message = 422, code, detail or code
        self.detail = detail


class IdempotencyConflict(UserError):
    """The Idempotency-Key was used before, by the same user, for different bytes."""

    def __init__(self, upload: Upload) -> None:
        super().__init__(upload.code)
        self.status, self.code, self.message = 409, "upload:idempotency-conflict", upload.code
        self.upload = upload


class ProjectRefused(UserError):
    """No project to upload to: none named and none implied, not one of the caller's, or read-only.
    The API answers it with the projects that would do (``api._project_refusal``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class TeamError(UserError):
    """A refused team change; ``code`` is stable (``team:<reason>``), ``message`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.status = 400
        self.code = code
        self.message = message


class ExploreError(UserError):
    """A question to the explore store that cannot be answered (no store, too large, busy, a bad
    parameter)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
