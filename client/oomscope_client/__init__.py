"""oomscope_client: a small torch-side helper for training jobs.

Three jobs, each usable alone:

- ``record(...)`` starts CUDA allocator history early (also a context manager),
- ``dump_on_oom(dir)`` writes a snapshot (plus a JSON sidecar) when a CUDA OOM happens,
- ``upload(path, url, token, ...)`` posts a snapshot to an oomscope site with the stdlib only.

Importing this package never imports torch (nor Django): torch is imported inside the
functions that need it, so the uploader works on a machine without torch.
"""

from __future__ import annotations

from oomscope_client.capture import OomDumper, Recording, dump_on_oom, dump_snapshot, record
from oomscope_client.upload import UploadError, upload

__all__ = [
    "OomDumper",
    "Recording",
    "UploadError",
    "dump_on_oom",
    "dump_snapshot",
    "record",
    "upload",
]
__version__ = "0.1.0"
