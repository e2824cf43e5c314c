"""A run's rank files as one archive: a tar (plain, gzip, bzip2 or xz) or a zip holding one snapshot
per rank and, where the client wrote them, their sidecars (``NAME.json``).

``unpack_ranks`` copies the members into a folder of the caller's and returns their paths, or
None when the file is no such archive (a snapshot itself: a zip that ``torch.save`` wrote holds a
``data.pkl`` and is a snapshot, not an archive of ranks). Only regular files whose names end as
snapshots or sidecars do are taken, by their base name (a member's folders, ``..`` and absolute
paths are dropped, links are skipped), each up to the reader's own input cap, and at most
``MAX_MEMBERS`` of them; what each snapshot holds is then checked by the reader as any file is.

``list_members`` reads the listing alone (names, kinds, declared sizes), for callers that refuse an
archive before unpacking it (the site's ``webapp/snapshots/intake/runarchive.py``); ``archive_kind`` says
whether a file is such an archive. A zip is told by its first bytes as well as its directory: a tar
whose last member is a zip would otherwise be read as that zip.
"""

from __future__ import annotations

import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from analysis.reader import ReadLimits
from analysis.runs import RunInputError

MAX_MEMBERS = 4096
SNAPSHOT_SUFFIXES = (".pickle", ".pickle.gz", ".pkl", ".pkl.gz", ".pt")
SIDECAR_SUFFIX = ".json"
CHUNK = 1 << 20


def _wanted(name: str) -> str | None:
    base = PurePosixPath(name.replace("\\", "/")).name
    if not base or base.startswith("."):
        return None
    return base if base.endswith((*SNAPSHOT_SUFFIXES, SIDECAR_SUFFIX)) else None


def _copy(source: IO[bytes], target: Path, limit: int) -> None:
    copied = 0
    with target.open("wb") as out:
        while chunk := source.read(CHUNK):
            copied += len(chunk)
            if copied > limit:
                raise RunInputError("member-too-large", f"{target.name}: over {limit:,} bytes")
            out.write(chunk)


def _is_torch_save_zip(names: list[str]) -> bool:
    return any(PurePosixPath(n).name == "data.pkl" for n in names)


@dataclass(frozen=True)
class Member:
    """One entry of an archive as its listing states it, before any byte of it is read."""

    name: str
    kind: str  # "file", "dir", "link" (symbolic or hard) or "other" (a device, a FIFO)
    size: int  # the uncompressed size the listing declares


def _is_zip(path: Path) -> bool:
    """A zip from its first bytes, not only its tail: ``zipfile.is_zipfile`` finds the directory of a
    zip stored at the end of another file (a tar whose last member is a zip), and would read that.
    An empty zip (no member, so no local header) is no archive of ranks; the reader refuses it."""
    with path.open("rb") as fh:
        head = fh.read(4)
    return head == b"PK\x03\x04" and zipfile.is_zipfile(path)


def archive_kind(path: Path) -> str | None:
    """``zip`` or ``tar`` when ``path`` is an archive of ranks; None for anything else (a snapshot,
    including the zip ``torch.save`` writes)."""
    if _is_zip(path):
        with zipfile.ZipFile(path) as zipped:
            return None if _is_torch_save_zip(zipped.namelist()) else "zip"
    try:
        return "tar" if tarfile.is_tarfile(path) else None
    except (OSError, EOFError, tarfile.TarError):
        return None


_ZIP_LINK = 0o120000  # S_IFLNK in a zip entry's Unix mode (external_attr's high 16 bits)


def list_members(path: Path, *, max_members: int = MAX_MEMBERS, max_total_bytes: int | None = None) -> list[Member]:
    """The archive's entries, read from its listing only; ``too-many-members`` past ``max_members``,
    ``too-large`` once the files' declared sizes together pass ``max_total_bytes``. Both stop the
    listing where they trip: a compressed tar is listed by decompressing it entry by entry, so a
    bomb of one huge member is refused at its header, not after inflating it."""
    kind = archive_kind(path)
    out: list[Member] = []
    total = 0

    def add(member: Member) -> None:
        nonlocal total
        if len(out) >= max_members:
            raise RunInputError("too-many-members", f"{path.name}: more than {max_members} entries")
        total += member.size if member.kind == "file" else 0
        if max_total_bytes is not None and total > max_total_bytes:
            raise RunInputError("too-large", f"{path.name}: its files are over {max_total_bytes:,} bytes together")
        out.append(member)

    if kind == "zip":
        with zipfile.ZipFile(path) as zipped:
            for info in zipped.infolist():
                mode = (info.external_attr >> 16) & 0o170000
                entry = "dir" if info.is_dir() else "link" if mode == _ZIP_LINK else "file"
                add(Member(info.filename, entry, info.file_size))
    elif kind == "tar":
        with tarfile.open(path, "r:*") as archive:
            for tar_entry in archive:
                tar_kind = (
                    "file"
                    if tar_entry.isfile()
                    else "dir"
                    if tar_entry.isdir()
                    else "link"
                    if tar_entry.issym() or tar_entry.islnk()
                    else "other"
                )
                add(Member(tar_entry.name, tar_kind, tar_entry.size))
    return out


def unpack_ranks(path: Path, into: Path, *, limits: ReadLimits | None = None) -> list[Path] | None:
    """The archive's snapshot and sidecar files, copied into ``into``; None if ``path`` is no archive."""
    cap = (limits or ReadLimits()).max_input_bytes
    taken: list[Path] = []

    def target_for(name: str) -> Path | None:
        base = _wanted(name)
        if base is None:
            return None
        if len(taken) >= MAX_MEMBERS:
            raise RunInputError("too-many-members", f"{path}: more than {MAX_MEMBERS} files")
        target = into / base
        if target in taken:
            raise RunInputError("duplicate-member", f"{path}: two members are named {base}")
        taken.append(target)
        return target

    if _is_zip(path):
        with zipfile.ZipFile(path) as zipped:
            infos = zipped.infolist()
            if _is_torch_save_zip([i.filename for i in infos]):
                return None
            into.mkdir(parents=True, exist_ok=True)
            for info in infos:
                target = None if info.is_dir() else target_for(info.filename)
                if target is not None:
                    with zipped.open(info) as member:
                        _copy(member, target, cap)
        return sorted(taken)
    try:
        is_tar = tarfile.is_tarfile(path)
    except (OSError, EOFError):
        is_tar = False
    if not is_tar:
        return None
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "r:*") as archive:
        for entry in archive:
            if not entry.isfile():
                continue  # folders, links, devices: nothing of a rank
            target = target_for(entry.name)
            if target is None:
                continue
            source = archive.extractfile(entry)
            if source is not None:
                with source:
                    _copy(source, target, cap)
    return sorted(taken)


def rank_paths(paths: list[Path], scratch: Path) -> tuple[list[Path], bool]:
    """The snapshots among ``paths`` with every archive unpacked under ``scratch``; and whether
    there was an archive (then the files are a run's ranks, however many)."""
    out: list[Path] = []
    unpacked = False
    for index, path in enumerate(paths):
        members = unpack_ranks(path, scratch / str(index))
        if members is None:
            out.append(path)
            continue
        unpacked = True
        out.extend(m for m in members if not m.name.endswith(SIDECAR_SUFFIX))
    if unpacked and not out:
        raise RunInputError("empty-archive", "no snapshot (.pickle, .pickle.gz, .pkl, .pt) in the archive")
    return out, unpacked
