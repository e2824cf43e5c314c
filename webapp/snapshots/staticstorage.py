"""Static files: WhiteNoise's compressed manifest storage, lenient where no manifest was collected.

After ``collectstatic`` (``make static``, the container build) every file gets a content-hashed
name and gzip (and brotli, where installed) copies; WhiteNoise serves hashed names with a
one-year ``immutable`` cache, so BokehJS (``bokeh/<version>/bokeh.min.<hash>.js``, 1.27 MB) is
downloaded once per version, compressed. Without a collected manifest (tests, a checkout that
never ran ``make static``) a name falls back to itself and WhiteNoise serves it from the finders
with a short cache, as before.
"""

from __future__ import annotations

from whitenoise.storage import CompressedManifestStaticFilesStorage


class StaticStorage(CompressedManifestStaticFilesStorage):
    # No reference rewriting: our CSS has no url() and BokehJS's bundles are used as shipped
    # (Django's sourceMappingURL pattern trips over code inside bokeh's compiler.js).
    patterns = ()

    def stored_name(self, name: str) -> str:
        try:
            return str(super().stored_name(name))
        except ValueError:  # no manifest entry: nothing was collected for this name
            return name
