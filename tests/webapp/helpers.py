"""Helpers shared by the web app tests (imported as ``tests.webapp.helpers``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
GPT_OOM = FIXTURES / "gpt_varlen_oom.pickle.gz"


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def make_upload(project: Any, user: Any, path: Path = GPT_OOM, **fields: Any) -> Any:
    """An Upload row with its stored blob, without publishing a task (tests run it directly)."""
    import hashlib

    from django.core.files.uploadedfile import SimpleUploadedFile

    from webapp.snapshots.intake import blobs, store
    from webapp.snapshots.models import Upload

    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    uploaded = SimpleUploadedFile(path.name, data)
    blob = blobs.store_blob(uploaded, sha)
    return Upload.objects.create(
        code=store.new_upload_code(),
        project=project,
        uploaded_by=user,
        filename=path.name,
        bytes=len(data),
        sha256=sha,
        blob_name=blob,
        format="pickle.gz" if data[:2] == b"\x1f\x8b" else "pickle",
        **fields,
    )


def database_url_of_test_db() -> str:
    """DATABASE_URL for a subprocess that must see the test database (the worker)."""
    from django.db import connection

    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"  # NAME is absolute: sqlite:////abs/path
    user = quote(s.get("USER") or "")
    password = quote(s.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = s.get("HOST") or ""
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{s['NAME']}"
