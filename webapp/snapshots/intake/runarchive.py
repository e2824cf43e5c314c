"""One tar or zip of a run's per-rank snapshots, uploaded as one file, made into the run's uploads.

The archive is hostile input. It is checked from its listing before a byte of a member is read
(``analysis.rankfiles.list_members``): at most ``RUN_ARCHIVE_MAX_MEMBERS`` entries, no link or
special file, no absolute or ``..`` path, no archive inside it, and the snapshots' declared sizes
together within the upload cap. Only then does ``analysis.rankfiles.unpack_ranks`` (the CLI's
unpacking: links skipped, each member capped while copied, names reduced to their base) copy the
snapshots and sidecars into a scratch folder; each copied snapshot must then sniff as one, and the
team quota must hold them all. Any refusal is a ``LimitExceeded`` (the intake's refusal) with an
``upload:archive-*`` code, raised before any row or blob is written; the scratch folder goes in every case.

Each snapshot becomes one upload of the run, as the client's per-rank uploads do: its rank from
the client's sidecar beside it (``NAME.json``), else ``rank<N>`` in its name, else its order; the
run's world size is the number of snapshots; the sidecar's ``oom_message`` and ``error`` are
carried as the client's fields are (the form's own ``oom_message`` and per-rank fields are not
applied to every rank; its run name, tags, note and job fields are). The ranks are created in one
transaction, so the run's chord is published once, when the last one commits (``runs.run_attach``).
"""

from __future__ import annotations

import hashlib
import lzma
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction

from analysis.__main__ import sidecar_beside
from analysis.limits import OomMessageError
from analysis.rankfiles import SIDECAR_SUFFIX, archive_kind, list_members, unpack_ranks
from analysis.reader import ReadLimits
from analysis.runs import RunInputError, rank_from_name
from webapp.snapshots import messages
from webapp.snapshots.errors import LimitExceeded, Refusal
from webapp.snapshots.intake import disk
from webapp.snapshots.intake.quota import check_team_queued_cost, check_team_quota
from webapp.snapshots.intake.uploads import SNIFF_BYTES, sniff

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from webapp.snapshots.models import Project, Run, Upload

ARCHIVE = "archive"  # the format ``intake.admit`` names a run's archive by
# Names of archives (a member named so is refused, whatever it holds).
NESTED_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tbz2", ".tar.bz2", ".txz", ".tar.xz", ".zip", ".7z", ".rar")
# Fields the archive's ranks set themselves; the form's values for these are not used.
PER_RANK_FIELDS = ("rank", "world_size", "local_rank", "error")


def refusal(code: str, detail: str = "") -> LimitExceeded:
    return LimitExceeded(422, code, messages.error_message(code, detail))


@contextmanager
def _damage_refused() -> Iterator[None]:
    """What a damaged or crafted archive raises while it is listed and unpacked (a member whose CRC
    or compressed stream is broken, a truncated tar.gz, an encrypted or unknown zip method, a name
    too long for the disk, a sidecar nested past the JSON parser's depth) is
    ``upload:archive-unreadable`` with what went wrong, never a 500 (issue 36: seven crafted archives
    answered Django's HTML 500). A full disk stays the caller's 507."""
    try:
        yield
    except (LimitExceeded, RunInputError):  # the caller's own refusals
        raise
    except OSError as exc:
        if disk.is_full(exc):
            raise
        raise refusal("upload:archive-unreadable", f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    except (
        EOFError,
        tarfile.TarError,
        zipfile.BadZipFile,
        zlib.error,
        lzma.LZMAError,
        NotImplementedError,
        RuntimeError,  # RecursionError, zipfile's "File is encrypted"
        ValueError,  # UnicodeDecodeError, a NUL in a member's name
    ) as exc:
        raise refusal("upload:archive-unreadable", f"{type(exc).__name__}: {str(exc)[:200]}") from exc


@dataclass(frozen=True)
class RankFile:
    """One rank's snapshot out of the archive, with what the upload row needs."""

    rank: int
    path: Path
    size: int
    sha256: str
    fmt: str
    oom_message: str
    meta: dict[str, Any] = field(default_factory=dict)
    cost: int = 0  # the rank's estimated analysis cost (``cost.estimate_cost``), checked at intake


def file_path(uploaded: Any) -> Path | None:
    """The received file's path on disk (the capped handler writes one), or None."""
    getter = getattr(uploaded, "temporary_file_path", None)
    return Path(getter()) if getter is not None else None


def is_archive(uploaded: Any) -> bool:
    path = file_path(uploaded)
    return path is not None and archive_kind(path) is not None


def _max_members() -> int:
    return int(getattr(settings, "RUN_ARCHIVE_MAX_MEMBERS", 1024))


@dataclass(frozen=True)
class Listing:
    """What an archive's listing declares, before a byte of a member is read: its files (each a
    rank's snapshot or a sidecar) and their sizes together."""

    files: int
    sidecars: int
    declared_bytes: int

    @property
    def ranks(self) -> int:
        """The ranks it may hold: its files that are no sidecar (each one becomes an analysis)."""
        return self.files - self.sidecars


def check_listing(path: Path) -> Listing:
    """Refuse from the listing alone: too many entries, links, special files, escaping paths,
    archives inside, snapshots whose declared sizes together pass the upload cap."""
    # Unpacking needs the declared bytes twice (scratch and blobs) above the disk's reserve: the
    # listing stops at the header that passes that too, before inflating a bomb's member to skip it.
    room = max(0, (disk.free_bytes() - settings.DISK_MIN_FREE_BYTES) // 2)
    cap = min(settings.UPLOAD_MAX_BYTES, room)
    try:
        with _damage_refused():  # a damaged stream is met while listing a compressed tar, too
            members = list_members(path, max_members=_max_members(), max_total_bytes=cap)
    except RunInputError as exc:
        too_many = exc.code.endswith("too-many-members")
        if not too_many and cap < settings.UPLOAD_MAX_BYTES:
            raise disk.full_error() from exc
        code = "upload:archive-too-many-members" if too_many else "upload:archive-too-large"
        raise refusal(code, exc.message) from exc
    declared = files = sidecars = 0
    for member in members:
        name = member.name.replace("\\", "/")
        parts = PurePosixPath(name).parts
        if name.startswith("/") or (parts and parts[0].endswith(":")) or ".." in parts:
            raise refusal("upload:archive-unsafe-path", member.name)
        if member.kind == "link":
            raise refusal("upload:archive-link", member.name)
        if member.kind == "other":
            raise refusal("upload:archive-special-file", member.name)
        if member.kind == "file" and name.lower().endswith(NESTED_SUFFIXES):
            raise refusal("upload:archive-nested", member.name)
        if member.kind == "file":
            declared += member.size
            files += 1
            sidecars += name.endswith(SIDECAR_SUFFIX)
    if declared > settings.UPLOAD_MAX_BYTES:
        raise refusal("upload:archive-too-large", _over_cap(declared))
    return Listing(files, sidecars, declared)


def _over_cap(size: int) -> str:
    return f"{messages.human_bytes(size)} unpacked, over the {messages.human_bytes(settings.UPLOAD_MAX_BYTES)} limit"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _int_of(sidecar: dict[str, Any] | None, key: str) -> int | None:
    value = (sidecar or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text_of(sidecar: dict[str, Any] | None, key: str) -> str:
    value = (sidecar or {}).get(key)
    return value if isinstance(value, str) else ""


def _rank_file(path: Path, position: int) -> RankFile:
    """One unpacked snapshot: refused when it is an archive or no snapshot; its rank and fields."""
    if archive_kind(path) is not None:
        raise refusal("upload:archive-nested", path.name)
    with path.open("rb") as fh:
        head = fh.read(SNIFF_BYTES)
    try:
        fmt = sniff(head)
    except Refusal as exc:
        raise refusal("upload:archive-not-a-snapshot", f"{path.name}: {messages.error_message(exc.code)}") from exc
    try:
        sidecar = sidecar_beside(path)
    except OomMessageError as exc:
        raise refusal("upload:archive-bad-sidecar", exc.message) from exc
    rank = _int_of(sidecar, "rank")
    rank = rank if rank is not None else rank_from_name(path.name)
    rank = rank if rank is not None else position
    job = (sidecar or {}).get("job")
    meta: dict[str, Any] = {
        "local_rank": _int_of(sidecar, "local_rank"),
        "host": _text_of(sidecar, "host")[:200],
        "torch_version": _text_of(sidecar, "torch")[:50],
        "job_id": (str(job.get("job_id") or "") if isinstance(job, dict) else "")[:200],
        "error": _text_of(sidecar, "error")[:5000],
    }
    oom_message = _usable_oom_message(_text_of(sidecar, "oom_message"))
    size = path.stat().st_size
    meta = {k: v for k, v in meta.items() if v}
    return RankFile(rank, path, size, _sha256(path), fmt, oom_message, meta, _rank_cost(path, size))


def _rank_cost(path: Path, size: int) -> int:
    """The rank's analysis cost, estimated and its shape checked as a single upload's are (issue 36:
    they were checked on the archive, which hides each rank's gzip members and devices)."""
    from webapp.snapshots.errors import IntakeError
    from webapp.snapshots.intake.cost import estimate_cost

    with path.open("rb") as fh:
        try:
            return estimate_cost(UploadedFile(fh, name=path.name, size=size)).check().cost_bytes
        except IntakeError as exc:
            raise LimitExceeded(exc.status, exc.code, f"{path.name}: {exc.message}") from exc


def _usable_oom_message(text: str) -> str:
    """The sidecar's OOM message when torch's parser reads it (as the form's field is checked);
    an unreadable one is left out rather than refusing the rank's snapshot."""
    from webapp.snapshots.intake.forms import clean_oom_message

    try:
        return clean_oom_message(text)
    except Exception:  # forms.ValidationError: not torch's message
        return ""


def read_ranks(archive: Path, scratch: Path, project: Project, listing: Listing | None = None) -> list[RankFile]:
    """The archive's ranks, unpacked under ``scratch`` and checked; ``LimitExceeded`` on any refusal.

    Before a byte is unpacked, the team's quota and the disk guard are charged with what the listing
    declares (the disk twice: the scratch copy and the stored blobs; issue 36: a 388-byte tar.bz2
    stored 300 MB past the guard, which had seen the request's size). After it, each rank's cost and
    shape are checked as one upload's, and their costs together against the team's queued cost."""
    listing = listing if listing is not None else check_listing(archive)
    check_team_quota(project.team_id, listing.declared_bytes)
    disk.check_room(2 * listing.declared_bytes)
    try:
        members = unpack_ranks(archive, scratch, limits=ReadLimits(max_input_bytes=settings.UPLOAD_MAX_BYTES))
    except RunInputError as exc:
        reason = exc.code.rsplit(":", 1)[-1]  # the library's "run:<reason>"
        code = "upload:archive-too-large" if reason == "member-too-large" else f"upload:archive-{reason}"
        raise refusal(code, exc.message) from exc
    snapshots = [m for m in members or [] if not m.name.endswith(SIDECAR_SUFFIX)]
    if not snapshots:
        raise refusal("upload:archive-empty")
    ranks = [_rank_file(path, position) for position, path in enumerate(snapshots)]
    seen: dict[int, str] = {}
    for item in ranks:
        if item.rank in seen:
            raise refusal("upload:archive-duplicate-rank", f"rank {item.rank}: {seen[item.rank]} and {item.path.name}")
        seen[item.rank] = item.path.name
    total = sum(item.size for item in ranks)
    if total > settings.UPLOAD_MAX_BYTES:
        raise refusal("upload:archive-too-large", _over_cap(total))
    check_team_quota(project.team_id, total)
    for item in ranks:  # each alone within the limit, then all of them with what the team has queued
        check_team_queued_cost(project.team_id, item.cost, queued=0)
    check_team_queued_cost(project.team_id, sum(item.cost for item in ranks))
    return sorted(ranks, key=lambda item: item.rank)


def create_run(
    *,
    user: User,
    project: Project,
    archive: Any,
    archive_sha256: str,
    fields: dict[str, Any],
    run_meta: dict[str, Any],
    idempotency_key: str = "",
    listing: Listing | None = None,
) -> Run:
    """Make the archive's ranks into one run's uploads (all of them, or none); return the Run.

    The run is the form's ``run`` name, else ``<archive name>-<first 8 hex of its sha256>`` (the
    same archive sent twice joins the same run). An ``Idempotency-Key`` is kept per rank
    (``KEY#r<N>``), so a retried archive replays every rank's upload.
    """
    from webapp.snapshots.intake import blobs, store
    from webapp.snapshots.models import Run

    path = file_path(archive)
    if path is None:  # is_archive said yes, so the handler wrote a file
        raise refusal("upload:archive-unreadable")
    scratch = Path(tempfile.mkdtemp(prefix="oomscope-run-", dir=getattr(settings, "FILE_UPLOAD_TEMP_DIR", None)))
    fresh: list[str] = []  # blobs this call wrote: removed again if the run is not made
    try:
        with _damage_refused():
            ranks = read_ranks(path, scratch, project, listing)
        stem = PurePosixPath(archive.name or "run").name.split(".")[0] or "run"
        name = fields.get("run") or f"{stem}-{archive_sha256[:8]}"
        common = {k: v for k, v in run_meta.items() if k not in PER_RANK_FIELDS}
        created: list[Upload] = []
        with transaction.atomic():
            for item in ranks:
                if not default_storage.exists(blobs.blob_name_for(item.sha256)):
                    fresh.append(blobs.blob_name_for(item.sha256))
                with item.path.open("rb") as fh:
                    uploaded = UploadedFile(fh, name=item.path.name, size=item.size)
                    created.append(
                        store.upload_create(
                            user=user,
                            project=project,
                            uploaded=uploaded,
                            sha256=item.sha256,
                            fmt=item.fmt,
                            **{**fields, "run": name, "oom_message": item.oom_message},
                            idempotency_key=f"{idempotency_key[:90]}#r{item.rank}" if idempotency_key else "",
                            run_meta={**common, **item.meta, "rank": item.rank, "world_size": len(ranks)},
                            estimated_cost=item.cost,
                        )
                    )
        return Run.objects.select_related("project").get(project=project, name=name[:200])
    except BaseException:
        blobs.blobs_drop_unnamed(fresh)  # the rows were rolled back: nothing names them
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
