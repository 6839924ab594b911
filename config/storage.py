"""Static files: whitenoise's compressed, content-hashed storage.

``collectstatic`` (``make run``, the container build) writes every file under a hashed
name plus a manifest, and whitenoise serves them with far-future cache headers. A process
that never ran ``collectstatic`` (the test suite, a first ``manage.py shell``) has no
manifest: its ``{% static %}`` URLs fall back to the plain names instead of failing every
page that links a stylesheet.
"""

from __future__ import annotations

from whitenoise.storage import CompressedManifestStaticFilesStorage


class StaticFilesStorage(CompressedManifestStaticFilesStorage):
    def stored_name(self, name: str) -> str:
        try:
            return super().stored_name(name)
        except ValueError:
            # Not in the manifest (or no manifest): the unhashed name.
            return name
