"""Values every page may use."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def site(request: HttpRequest) -> dict[str, Any]:
    return {"bokeh_version": settings.BOKEH_VERSION, "max_upload_bytes": settings.UPLOAD_MAX_BYTES}
