"""Static files after collectstatic (issue 10, item 7): hashed names, compressed, a long cache for
the versioned BokehJS; without a collected manifest, names fall back to themselves."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import RequestFactory, override_settings


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("static")
    with override_settings(STATIC_ROOT=root):
        call_command("collectstatic", "--noinput", verbosity=0)
    return root


def test_bokehjs_is_served_hashed_gzipped_and_cached_for_a_year(collected: Path) -> None:
    from django.conf import settings
    from django.contrib.staticfiles.storage import staticfiles_storage
    from django.core.files.storage import storages
    from whitenoise.middleware import WhiteNoiseMiddleware

    from webapp.snapshots.templatetags.oomscope import bokeh_js_url

    name = f"bokeh/{settings.BOKEH_VERSION}/bokeh.min.js"
    with override_settings(STATIC_ROOT=collected, WHITENOISE_USE_FINDERS=False, DEBUG=False):
        storages._storages.pop("staticfiles", None)  # a storage rooted at the new STATIC_ROOT
        staticfiles_storage._wrapped = storages["staticfiles"]
        try:
            url = bokeh_js_url()
            # A content hash in the name: a new BokehJS gets a new URL, so the old one may be cached forever.
            assert url.startswith(f"/static/bokeh/{settings.BOKEH_VERSION}/bokeh.min.") and url.endswith(".js")
            assert url != f"/static/{name}"
            middleware = WhiteNoiseMiddleware(lambda request: pytest.fail("not served as a static file"))
            response: Any = middleware(RequestFactory().get(url, HTTP_ACCEPT_ENCODING="gzip, br"))
            body = b"".join(response.streaming_content)
        finally:
            storages._storages.pop("staticfiles", None)
            staticfiles_storage._wrapped = storages["staticfiles"]
    original = (collected / name).read_bytes()
    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert "max-age=315360000" in response["Cache-Control"] and "immutable" in response["Cache-Control"]
    assert gzip.decompress(body) == original
    assert len(body) < 0.4 * len(original), (len(body), len(original))  # measured: 1.27 MB -> about 0.35 MB


def test_without_a_manifest_names_fall_back_to_themselves() -> None:
    from webapp.snapshots.staticstorage import StaticStorage

    storage = StaticStorage(location="/nonexistent-static-root")
    assert storage.stored_name("css/oomscope.css") == "css/oomscope.css"
