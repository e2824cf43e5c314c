"""The reader's caps at their exact edges, on hand-built inputs.

Each cap is tried at the value that must pass and one below it, so an off-by-one (``>`` for
``>=``) in the check fails a case. The sizes are those of the inputs built here (``len`` of the
bytes); the node counts are computed by hand from the converter's charges (in the comments);
memory bounds are measured with tracemalloc. These run in a few seconds, so ``make mutation``'s
reader-limits target uses them (and one zip test of test_reader.py); the real files' limits are
test_reader.py's and test_hostile.py's.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import tracemalloc
import zipfile
from typing import Any

import pytest

from analysis.errors import SnapshotError
from analysis.model import Annotation
from analysis.reader import ReadLimits, read_snapshot

EMPTY: dict[str, Any] = {"segments": [], "device_traces": []}


def code_of(data: bytes, limits: ReadLimits | None = None) -> str:
    """The refusal's code, or "ok" when the input is read."""
    try:
        read_snapshot(data, limits=limits or ReadLimits())
    except SnapshotError as exc:
        return exc.code
    return "ok"


def refusal(data: bytes, limits: ReadLimits | None = None) -> str:
    """The refusal as the user reads it: "code: message"."""
    with pytest.raises(SnapshotError) as err:
        read_snapshot(data, limits=limits or ReadLimits())
    return str(err.value)


def padded(n: int) -> bytes:
    """A valid snapshot pickle made bigger (and very compressible) by an n-byte setting."""
    return pickle.dumps({**EMPTY, "allocator_settings": {"pad": "a" * n}}, protocol=4)


def torch_zip(payload: bytes, method: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        zf.writestr("archive/data.pkl", payload)
        zf.writestr("archive/version", "3\n")
    return buf.getvalue()


def exact_ratio(pack: Any) -> tuple[bytes, bytes, int]:
    """A padded pickle whose size is an exact multiple (> 50) of its packed size: (pickle,
    packed, ratio). Searched, not fixed: the packed size depends on the zlib build."""
    for n in range(4000, 40000):
        raw = padded(n)
        packed, size = pack(raw)
        if len(raw) % size == 0 and len(raw) // size > 50:
            return raw, packed, len(raw) // size
    raise AssertionError("no padding gives an exact ratio")


# ---------------------------------------------------------------------------- gzip


def test_gzip_decompressed_size_cap_at_its_edge() -> None:
    raw = padded(5000)
    gz = gzip.compress(raw, mtime=0)
    limits = {"ratio_grace_bytes": len(raw)}  # the ratio check out of the way
    # The cap is on the bytes after gunzip: exactly len(raw) is allowed, one byte less is not.
    assert code_of(gz, ReadLimits(max_decompressed_bytes=len(raw), **limits)) == "ok"
    got = refusal(gz, ReadLimits(max_decompressed_bytes=len(raw) - 1, **limits))
    assert got == f"snapshot:limit:decompressed-size: the content exceeds {len(raw) - 1} bytes once decompressed"


def test_gzip_ratio_cap_and_its_grace_at_their_edges() -> None:
    raw, gz, ratio = exact_ratio(lambda r: (g := gzip.compress(r, mtime=0), len(g)))
    # len(raw) == ratio x len(gz) exactly: a max_ratio of `ratio` allows it (not more than
    # ratio:1), `ratio - 1` refuses it, once past the grace (0 here).
    assert code_of(gz, ReadLimits(max_ratio=ratio, ratio_grace_bytes=0)) == "ok"
    got = refusal(gz, ReadLimits(max_ratio=ratio - 1, ratio_grace_bytes=0))
    assert got == (
        f"snapshot:limit:compression-ratio: the content expands more than {ratio - 1}:1"
        " (a decompression bomb, not a snapshot)"
    )
    # The grace: up to len(raw) decompressed bytes no ratio is enforced (max_ratio 1 here).
    assert code_of(gz, ReadLimits(max_ratio=1, ratio_grace_bytes=len(raw))) == "ok"
    got = code_of(gz, ReadLimits(max_ratio=1, ratio_grace_bytes=len(raw) - 1))
    assert got == "snapshot:limit:compression-ratio"


def test_gzip_members_trailing_bytes_truncation_and_damage() -> None:
    raw = padded(3000)
    whole = gzip.compress(raw, mtime=0)
    # Two gzip members are one stream: the pickle split across them reads as the pickle.
    two = gzip.compress(raw[:1000], mtime=0) + gzip.compress(raw[1000:], mtime=0)
    assert read_snapshot(two).settings.raw == read_snapshot(whole).settings.raw == {"pad": "a" * 3000}
    assert refusal(whole + b"junk") == "snapshot:format:trailing-bytes: 4 bytes follow the gzip stream"
    # Cut inside the deflate data (the 8-byte trailer and 4 bytes more gone): the input runs out
    # before the stream's end; the gzip is refused, not the part of a pickle it held.
    assert refusal(whole[:-12]) == "snapshot:format:truncated: the gzip stream ends early"
    damaged = bytearray(whole)
    damaged[20] ^= 0xFF  # inside the deflate data
    got = refusal(bytes(damaged))
    assert got.startswith(("snapshot:format:corrupt-gzip: the gzip stream is damaged (", "snapshot:format:truncated"))
    assert code_of(gzip.compress(b"plain text, not a pickle", mtime=0)) == "snapshot:format:not-a-snapshot"


def test_a_truncated_gzip_past_the_ratio_grace_is_refused_as_truncated() -> None:
    # 9 MiB decompressed (past the 8 MiB grace, the ratio check then runs on every count), cut
    # inside its deflate data: refused as a truncated gzip (max_ratio raised out of the way).
    raw = padded(9 << 20)
    cut = gzip.compress(raw, mtime=0)[:-12]
    got = refusal(cut, ReadLimits(max_ratio=1 << 20))
    assert got == "snapshot:format:truncated: the gzip stream ends early"


def test_gzip_member_with_the_size_cap_crossed_in_the_second_member() -> None:
    # The size counts over members: 1,000 + the rest; a cap of len(raw) - 1 is crossed only
    # by the last byte of the second member.
    raw = padded(3000)
    two = gzip.compress(raw[:1000], mtime=0) + gzip.compress(raw[1000:], mtime=0)
    limits = {"ratio_grace_bytes": len(raw)}
    assert code_of(two, ReadLimits(max_decompressed_bytes=len(raw), **limits)) == "ok"
    got = code_of(two, ReadLimits(max_decompressed_bytes=len(raw) - 1, **limits))
    assert got == "snapshot:limit:decompressed-size"


def test_a_gzip_bomb_is_refused_after_one_chunk_of_output() -> None:
    # 64 MiB of zeros (a gzip of about 64 KiB) under a 1 MiB cap: the cap is checked after each
    # 16 MiB chunk of output, so the reader holds about one chunk, never the 64 MiB.
    bomb = gzip.compress(bytes(64 << 20), mtime=0)
    tracemalloc.start()
    try:
        got = code_of(bomb, ReadLimits(max_decompressed_bytes=1 << 20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == "snapshot:limit:decompressed-size"
    assert peak < 40 << 20
    # 128 MiB of zeros under a 20 MiB cap (the ratio check off): crossed by the second chunk (32 MiB
    # read), refused there; the rest of the input is never decompressed.
    bomb = gzip.compress(bytes(128 << 20), mtime=0)
    tracemalloc.start()
    try:
        got = code_of(bomb, ReadLimits(max_decompressed_bytes=20 << 20, max_ratio=1 << 30))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == "snapshot:limit:decompressed-size"
    assert peak < 64 << 20


# ---------------------------------------------------------------------------- torch.save zip


def test_zip_member_size_cap_at_its_edge() -> None:
    raw = padded(5000)
    archive = torch_zip(raw)  # stored: the member's size is len(raw)
    limits = {"ratio_grace_bytes": len(raw)}
    assert code_of(archive, ReadLimits(max_decompressed_bytes=len(raw), **limits)) == "ok"
    got = code_of(archive, ReadLimits(max_decompressed_bytes=len(raw) - 1, **limits))
    assert got == "snapshot:limit:decompressed-size"


def test_zip_member_ratio_cap_at_its_edge() -> None:
    def deflated(r: bytes) -> tuple[bytes, int]:
        archive = torch_zip(r, zipfile.ZIP_DEFLATED)
        with zipfile.ZipFile(io.BytesIO(archive)) as zf:
            return archive, zf.getinfo("archive/data.pkl").compress_size

    _raw, archive, ratio = exact_ratio(deflated)
    # file_size == ratio x compress_size of the data.pkl member exactly.
    assert code_of(archive, ReadLimits(max_ratio=ratio, ratio_grace_bytes=0)) == "ok"
    got = code_of(archive, ReadLimits(max_ratio=ratio - 1, ratio_grace_bytes=0))
    assert got == "snapshot:limit:compression-ratio"


def test_a_zip_member_past_one_read_chunk_reads_whole() -> None:
    # The member is read 16 MiB at a time: a 17 MiB setting comes back whole, in one piece.
    raw = padded(17 << 20)
    snap = read_snapshot(torch_zip(raw), limits=ReadLimits(max_ratio=1))
    assert snap.settings.raw == {"pad": "a" * (17 << 20)}


def test_a_zip_without_a_data_pkl_is_refused_with_what_it_lacks() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/version", "3\n")
    assert refusal(buf.getvalue()) == (
        "snapshot:format:zip-without-pickle: a zip must be a torch.save archive holding exactly one */data.pkl"
    )


def test_damaged_or_encrypted_zip_is_refused_as_corrupt() -> None:
    archive = bytearray(torch_zip(padded(100), zipfile.ZIP_DEFLATED))
    archive[40] ^= 0xFF  # inside the member's deflate data: its CRC no longer matches
    got = refusal(bytes(archive))
    assert got.startswith("snapshot:format:corrupt-zip: the zip archive is damaged or unsupported (")
    assert code_of(torch_zip(b"not a pickle")) == "snapshot:format:not-a-snapshot"
    # The "encrypted" flag (bit 0 of the general purpose flags) set on data.pkl, in its local
    # header (offset 6) and its central directory entry (offset 8): zipfile asks for a password.
    plain = torch_zip(padded(100))
    locked = bytearray(plain)
    locked[6] |= 1
    central = plain.index(b"PK\x01\x02")
    locked[central + 8] |= 1
    got = refusal(bytes(locked))
    assert got.startswith("snapshot:format:corrupt-zip: the zip archive cannot be read (")
    assert "encrypted" in got


# ---------------------------------------------------------------------------- pickle end, reads


def test_one_byte_after_stop_is_refused_and_counted() -> None:
    data = pickle.dumps(EMPTY, protocol=4)
    with pytest.raises(SnapshotError) as err:
        read_snapshot(data + b".")
    assert err.value.code == "snapshot:format:trailing-bytes"
    assert "1 bytes follow" in str(err.value)
    assert code_of(data + b"\x00\x00\x00") == "snapshot:format:trailing-bytes"


def test_a_lying_length_field_reads_only_what_the_file_holds() -> None:
    # BINUNICODE claiming 256 MiB with 3 bytes behind it: refused as truncated, and the reader
    # never asks for the claim (a read of 256 MiB would allocate it: tracemalloc would see it).
    data = b"\x80\x04X" + struct.pack("<I", 256 << 20) + b"abc"
    tracemalloc.start()
    try:
        got = code_of(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == "snapshot:format:truncated"
    assert peak < 16 << 20


def test_text_opcodes_and_large_reads_past_the_prefetch_window() -> None:
    # A protocol-2 pickle may still hold protocol-0 text opcodes: a 100,000-character STRING
    # ("S'...'\n") is longer than the unpickler's prefetched window (64 KiB), so it is read by
    # readline; a 300,000-byte BINBYTES by readinto. Both read (the bytes are then refused by the
    # schema: a setting is a scalar), neither as a failing call.
    s = "y" * 100_000
    p = pickle.dumps({**EMPTY, "allocator_settings": {"s": s}}, protocol=2)
    binunicode = b"X" + struct.pack("<I", len(s)) + s.encode()
    assert p.count(binunicode) == 1
    assert read_snapshot(p.replace(binunicode, b"S'" + s.encode() + b"'\n")).settings.raw == {"s": s}
    big = pickle.dumps({**EMPTY, "allocator_settings": {"b": b"x" * 300_000}}, protocol=4)
    assert code_of(big) == "snapshot:schema:wrong-type"


# ---------------------------------------------------------------------------- the node budget


def test_node_budget_at_its_edge_counted_by_hand() -> None:
    # {"segments": [], "device_traces": [[], []]}: the top-level dict charges 1 + its 2 keys = 3,
    # then the three top-level lists their lengths, 0 + 2 + 0 (no external_annotations) = 2:
    # 5 nodes. A budget of 5 reads it, 4 does not (4 is met by neither charge alone: the
    # charges add up).
    data = pickle.dumps({"segments": [], "device_traces": [[], []]}, protocol=4)
    assert code_of(data, ReadLimits(nodes_per_byte=0, min_nodes=5)) == "ok"
    assert refusal(data, ReadLimits(nodes_per_byte=0, min_nodes=4)) == (
        "snapshot:limit:expansion: the object graph expands past 4 nodes (0 per file byte): a memo bomb, not a snapshot"
    )
    # The budget is max(min_nodes, nodes_per_byte x file size): with min_nodes 0 the size
    # term alone must cover the 5 nodes. len(data) bytes x 1 >= 5; x 0 is 0.
    assert code_of(data, ReadLimits(nodes_per_byte=1, min_nodes=0)) == "ok"
    assert code_of(data, ReadLimits(nodes_per_byte=0, min_nodes=0)) == "snapshot:limit:expansion"
    # ... and the larger of the two counts: min_nodes 5 with a size term of 0, or the reverse.
    assert code_of(data, ReadLimits(nodes_per_byte=1, min_nodes=4)) == "ok"


@pytest.mark.parametrize("compiled", [True, False])
def test_node_budget_passed_among_the_annotations_counted_by_hand(compiled: bool) -> None:
    # The top-level dict 1 + its 3 keys, the lists' lengths 0 + 0 + 2, then each annotation dict its
    # 4 keys: 6, 10, 14. Where the second annotation's stage is not a str, the charge for it comes
    # first with a budget of 13 (expansion), its check with 14 (wrong-type); 9 is passed by the first's.
    ann = {"name": "step", "stage": "START", "device": 1, "time_us": 4}

    def read(stage: object, budget: int) -> object:
        root = {"segments": [], "device_traces": [], "external_annotations": [ann, {**ann, "stage": stage}]}
        limits = ReadLimits(nodes_per_byte=0, min_nodes=budget)
        try:
            return read_snapshot(pickle.dumps(root, protocol=4), limits=limits, compiled=compiled).annotations
        except SnapshotError as exc:
            return str(exc)

    past = (
        "snapshot:limit:expansion: the object graph expands past {} nodes (0 per file byte): a memo bomb, "
        "not a snapshot"
    )
    assert read(7, 9) == past.format(9)
    assert read(7, 13) == past.format(13)
    assert read(7, 14) == "snapshot:schema:wrong-type: external_annotations[1]: expected a str, got int 7"
    assert read("END", 13) == past.format(13)
    got = read("END", 14)
    assert got == [Annotation("step", "START", 1, 4), Annotation("step", "END", 1, 4)]
    assert isinstance(got, list) and all(type(a) is Annotation for a in got)
