"""Hostile and malformed inputs for the reader, each with the code it must get.

Payloads that would run code try to create a canary file; the suite asserts it
never appears. Recipes follow ../shared/docs/reliability.md Appendix A.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Case:
    data: bytes
    code: str
    limits: dict[str, int] = field(default_factory=dict)


class _Evil:
    """Pickles as os.system(cmd): what a malicious snapshot would carry."""

    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.cmd,))


F = {"filename": "train.py", "line": 1, "name": "step"}


def snapshot_dict(n_events: int = 50) -> dict[str, Any]:
    """A small, valid modern snapshot (shared frame dicts, like real files)."""
    frames = [F, {"filename": "model.py", "line": 7, "name": "forward"}]
    events = [
        {
            "action": "alloc" if i % 2 == 0 else "free_completed",
            "addr": 4096 * (i // 2 + 1),
            "size": 512,
            "stream": 0,
            "time_us": i,
            "frames": frames,
        }
        for i in range(n_events)
    ]
    segment = {
        "device": 0,
        "address": 4096,
        "total_size": 2 << 20,
        "allocated_size": 0,
        "active_size": 0,
        "requested_size": 0,
        "stream": 0,
        "segment_type": "small",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [{"address": 4096, "size": 2 << 20, "requested_size": 0, "state": "inactive", "frames": []}],
    }
    return {"segments": [segment], "device_traces": [events], "allocator_settings": {}, "external_annotations": []}


def _zip(member: str, payload: bytes, method: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        zf.writestr(member, payload)
        zf.writestr(member.rsplit("/", 1)[0] + "/version", "3\n")
    return buf.getvalue()


def _gzip_zeros(n_mib: int) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * (1 << 20)
    return b"".join([comp.compress(chunk) for _ in range(n_mib)] + [comp.flush()])


def _deflated_zip_bomb(n_mib: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("archive/data.pkl", "w") as member:
        chunk = b"\0" * (1 << 20)
        for _ in range(n_mib):
            member.write(chunk)
    return buf.getvalue()


def build_cases(canary: Path) -> dict[str, Case]:
    cmd = f"touch {canary}"
    b = cmd.encode()
    cases: dict[str, Case] = {}

    # --- code execution, every protocol -------------------------------------
    for proto in range(6):
        # Protocols 0/1 have no PROTO header: refused by the sniffer, never unpickled.
        code = "snapshot:format:not-a-snapshot" if proto < 2 else "snapshot:unsafe:global"
        cases[f"reduce_os_system_p{proto}"] = Case(pickle.dumps(_Evil(cmd), protocol=proto), code)
    for proto in (2, 3, 4, 5):
        snap = snapshot_dict(200)
        snap["device_traces"][0][150]["frames"] = [F, {"filename": "x.py", "line": 2, "name": _Evil(cmd)}]
        cases[f"payload_deep_in_frames_p{proto}"] = Case(pickle.dumps(snap, protocol=proto), "snapshot:unsafe:global")
    cases["global_reduce_framed_p2"] = Case(b"\x80\x02cos\nsystem\n(S'" + b + b"'\ntR.", "snapshot:unsafe:global")
    cases["stack_global_p4"] = Case(
        b"\x80\x04\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c" + bytes([len(b)]) + b + b"\x94\x85\x94R\x94.",
        "snapshot:unsafe:global",
    )
    cases["inst"] = Case(b"\x80\x02(S'" + b + b"'\nios\nsystem\n.", "snapshot:unsafe:global")
    cases["obj"] = Case(b"\x80\x02(cos\nsystem\nS'" + b + b"'\no.", "snapshot:unsafe:global")
    cases["newobj_bytearray"] = Case(b"\x80\x02cbuiltins\nbytearray\n)\x81.", "snapshot:unsafe:global")
    cases["memo_confusion"] = Case(
        b"\x80\x04\x8c\x05posixq\x00\x8c\x06systemq\x0100h\x00h\x01\x93\x8c" + bytes([len(b)]) + b + b"\x85R.",
        "snapshot:unsafe:global",
    )
    # Without a global there is nothing callable: these opcodes fail on plain data.
    cases["reduce_on_dict"] = Case(b"\x80\x02}N\x85R.", "snapshot:unsafe:callable")
    cases["obj_on_dict"] = Case(b"\x80\x02(}o.", "snapshot:unsafe:callable")
    cases["newobj_on_dict"] = Case(b"\x80\x02})\x81.", "snapshot:unsafe:callable")
    cases["build_on_dict"] = Case(b"\x80\x02}}b.", "snapshot:unsafe:build")
    cases["ext1"] = Case(b"\x80\x02\x82\x01)R.", "snapshot:unsafe:extension")
    cases["ext2"] = Case(b"\x80\x02\x83\x01\x00)R.", "snapshot:unsafe:extension")
    cases["ext4"] = Case(b"\x80\x02\x84\x01\x00\x00\x00)R.", "snapshot:unsafe:extension")
    cases["persid"] = Case(b"\x80\x02P1\n.", "snapshot:unsafe:persistent-id")
    cases["binpersid"] = Case(b"\x80\x02K\x01Q.", "snapshot:unsafe:persistent-id")
    cases["next_buffer_p5"] = Case(b"\x80\x05\x97.", "snapshot:unsafe:out-of-band-buffer")

    # --- bombs ---------------------------------------------------------------------
    laughs: Any = ["lol"] * 10
    for _ in range(9):
        laughs = [laughs] * 10
    cases["billion_laughs"] = Case(
        pickle.dumps({"segments": laughs, "device_traces": []}, protocol=4), "snapshot:limit:expansion"
    )
    deep_laughs: Any = [F] * 8
    for _ in range(60):
        deep_laughs = [deep_laughs, deep_laughs]  # 2**60 leaves in a few hundred bytes
    cases["memo_dag_2_60"] = Case(
        pickle.dumps({"segments": [], "device_traces": [deep_laughs]}, protocol=4), "snapshot:limit:too-deep"
    )
    wide_laughs: Any = [F] * 8
    for _ in range(28):
        wide_laughs = [wide_laughs, wide_laughs]  # 2**31 leaves, 30 levels: under the depth cap
    cases["memo_dag_2_31"] = Case(
        pickle.dumps({"segments": [], "device_traces": [wide_laughs]}, protocol=4), "snapshot:limit:expansion"
    )
    # Schema-shaped: 100k events share one dict whose frames list holds 100k frames.
    shared_frames = [F] * 100_000
    event = {"action": "alloc", "addr": 0, "size": 1, "stream": 0, "frames": shared_frames}
    cases["shared_frames_bomb"] = Case(
        pickle.dumps({"segments": [], "device_traces": [[event] * 100_000]}, protocol=4), "snapshot:limit:expansion"
    )
    trace = [event | {"frames": [F]}] * 10_000
    cases["shared_trace_bomb"] = Case(
        pickle.dumps({"segments": [], "device_traces": [trace] * 20_000}, protocol=4), "snapshot:limit:expansion"
    )
    cases["nested_lists_root"] = Case(b"\x80\x04" + b"]" * 200_000 + b"a" * 199_999 + b".", "snapshot:limit:too-deep")
    cases["nested_in_segments"] = Case(
        b"\x80\x04}\x8c\x08segments" + b"]" * 100_000 + b"a" * 99_999 + b"s.", "snapshot:limit:too-deep"
    )
    cases["nested_in_frames"] = Case(
        pickle.dumps({"segments": [], "device_traces": [[dict(event, frames=[F, _nest(200)])]]}, protocol=4),
        "snapshot:limit:too-deep",
    )
    cases["cycle_in_segments"] = Case(b"\x80\x02}\x8c\x08segments]\x94h\x00as.", "snapshot:schema:cycle")
    cases["gzip_bomb"] = Case(_gzip_zeros(64), "snapshot:limit:compression-ratio")
    cases["gzip_over_size_cap"] = Case(
        gzip.compress(pickle.dumps(snapshot_dict(20_000), protocol=4)),
        "snapshot:limit:decompressed-size",
        {"max_decompressed_bytes": 100_000},
    )
    cases["zip_bomb_member"] = Case(_deflated_zip_bomb(64), "snapshot:limit:compression-ratio")
    cases["file_over_input_cap"] = Case(
        pickle.dumps(snapshot_dict(), protocol=4), "snapshot:limit:file-size", {"max_input_bytes": 1000}
    )

    # --- truncation and lying lengths -------------------------------------------------
    valid = pickle.dumps(snapshot_dict(), protocol=4)
    cases["empty_file"] = Case(b"", "snapshot:format:empty")
    cases["truncated_pickle"] = Case(valid[:-50], "snapshot:format:truncated")
    cases["truncated_gzip"] = Case(gzip.compress(valid)[:-30], "snapshot:format:truncated")
    cases["corrupt_gzip"] = Case(b"\x1f\x8b\x08\x00" + b"\xff" * 40, "snapshot:format:corrupt-gzip")
    cases["binunicode_2gib"] = Case(b"\x80\x04X" + struct.pack("<I", 0x7FFFFFFF) + b"abc", "snapshot:format:truncated")
    cases["long4_2gib"] = Case(b"\x80\x04\x8b" + struct.pack("<i", 0x7FFFFFF0) + b"\x01.", "snapshot:format:truncated")
    cases["frame_2gib"] = Case(b"\x80\x04\x95" + struct.pack("<Q", 1 << 31) + b"N.", "snapshot:format:truncated")
    # The C unpickler (CPython < 3.12) sizes its memo / bytes from the claim: the
    # process's RLIMIT_AS turns that into a clean refusal.
    cases["long_binput_0xfffffff0"] = Case(
        b"\x80\x04Nr" + struct.pack("<I", 0xFFFFFFF0) + b".", "snapshot:limit:memory"
    )
    cases["binbytes8_1tib"] = Case(b"\x80\x04\x8e" + struct.pack("<Q", 1 << 40) + b"abc", "snapshot:limit:memory")
    cases["trailing_pickle"] = Case(
        valid + b"\x80\x02cos\nsystem\n(S'" + b + b"'\ntR.", "snapshot:format:trailing-bytes"
    )
    cases["trailing_inside_frame"] = Case(_garbage_in_last_frame(), "snapshot:format:trailing-bytes")
    cases["trailing_after_gzip"] = Case(gzip.compress(valid) + b"junk", "snapshot:format:trailing-bytes")
    cases["duplicate_proto"] = Case(b"\x80\x04\x80\x02N.", "snapshot:schema:root-type")
    cases["proto_6"] = Case(b"\x80\x06N.", "snapshot:format:unsupported-protocol")
    cases["proto0_long_1m_digits"] = Case(b"\x80\x02L" + b"9" * 1_000_000 + b"L\n.", "snapshot:format:corrupt-pickle")
    cases["setitems_on_list"] = Case(b"\x80\x04](K\x01K\x02u.", "snapshot:format:corrupt-pickle")
    cases["invalid_opcode"] = Case(b"\x80\x02\xff.", "snapshot:format:corrupt-pickle")

    # --- not pickles ---------------------------------------------------------------------
    cases["html"] = Case(b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>", "snapshot:format:not-a-snapshot")
    cases["text"] = Case(b"Traceback (most recent call last):\n  File ...", "snapshot:format:not-a-snapshot")
    cases["whitespace"] = Case(b"   \n", "snapshot:format:empty")
    cases["bad_json"] = Case(b'{"segments": [1, 2,', "snapshot:format:bad-json")
    cases["deep_json"] = Case(b"[" * 200_000 + b"]" * 200_000, "snapshot:limit:too-deep")
    cases["json_nan"] = Case(
        b'{"segments": [], "allocator_settings": {"garbage_collection_threshold": NaN}}', "snapshot:schema:non-finite"
    )
    cases["zip_without_data_pkl"] = Case(_zip("archive/other.txt", b"hi"), "snapshot:format:zip-without-pickle")
    cases["zip_hostile_data_pkl"] = Case(
        _zip("archive/data.pkl", pickle.dumps(_Evil(cmd), protocol=2)), "snapshot:unsafe:global"
    )
    cases["zip_tensor_persistent_id"] = Case(
        _zip("archive/data.pkl", b"\x80\x02X\x01\x00\x00\x001Q."), "snapshot:unsafe:persistent-id"
    )
    cases["gzip_of_html"] = Case(gzip.compress(b"<html></html>"), "snapshot:format:not-a-snapshot")

    # --- wrong shapes ------------------------------------------------------------------------
    def shaped(mutate: Any) -> bytes:
        snap = snapshot_dict()
        mutate(snap)
        return pickle.dumps(snap, protocol=4)

    cases["root_is_int"] = Case(pickle.dumps(7, protocol=4), "snapshot:schema:root-type")
    cases["no_segments_key"] = Case(pickle.dumps({"data": b"\x80\x02."}, protocol=4), "snapshot:schema:missing-key")
    cases["segments_is_str"] = Case(shaped(lambda s: s.update(segments="oops")), "snapshot:schema:wrong-type")
    cases["segments_is_bytes"] = Case(shaped(lambda s: s.update(segments=b"\x80\x02.")), "snapshot:schema:wrong-type")
    cases["negative_size"] = Case(
        shaped(lambda s: s["device_traces"][0][3].update(size=-1)), "snapshot:schema:negative-size"
    )
    cases["negative_block_size"] = Case(
        shaped(lambda s: s["segments"][0]["blocks"][0].update(size=-5)), "snapshot:schema:negative-size"
    )
    cases["unknown_action"] = Case(
        shaped(lambda s: s["device_traces"][0][7].update(action="rm -rf")), "snapshot:schema:unknown-action"
    )
    cases["unknown_block_state"] = Case(
        shaped(lambda s: s["segments"][0]["blocks"][0].update(state="x")), "snapshot:schema:unknown-state"
    )
    cases["address_over_int64"] = Case(
        shaped(lambda s: s["device_traces"][0][2].update(addr=1 << 64)), "snapshot:schema:address-range"
    )
    cases["segment_address_over_int64"] = Case(
        shaped(lambda s: s["segments"][0].update(address=1 << 63)), "snapshot:schema:address-range"
    )
    cases["size_is_str"] = Case(
        shaped(lambda s: s["device_traces"][0][1].update(size="12")), "snapshot:schema:wrong-type"
    )
    # found by the hardening fuzzer: an unhashable stream broke the reader's stream interning (worker:internal)
    cases["stream_is_list"] = Case(
        shaped(lambda s: s["device_traces"][0][3].update(stream=[1, 2])), "snapshot:schema:wrong-type"
    )
    cases["stream_is_dict"] = Case(
        shaped(lambda s: s["device_traces"][0][3].update(stream={"a": 1})), "snapshot:schema:wrong-type"
    )
    cases["missing_action"] = Case(
        shaped(lambda s: s["device_traces"][0][4].pop("action")), "snapshot:schema:missing-key"
    )
    cases["event_is_list"] = Case(
        shaped(lambda s: s["device_traces"][0].__setitem__(5, [1, 2])), "snapshot:schema:wrong-type"
    )
    cases["frame_name_bytes"] = Case(
        shaped(lambda s: s["device_traces"][0][9].update(frames=[{"filename": "a", "line": 1, "name": b"x"}])),
        "snapshot:schema:wrong-type",
    )
    cases["frames_is_str"] = Case(
        shaped(lambda s: s["device_traces"][0][9].update(frames="abc")), "snapshot:schema:wrong-type"
    )
    cases["frames_is_empty_dict"] = Case(
        shaped(lambda s: s["device_traces"][0][9].update(frames={})), "snapshot:schema:wrong-type"
    )
    cases["nan_time"] = Case(
        shaped(lambda s: s["device_traces"][0][0].update(time_us=float("nan"))), "snapshot:schema:non-finite"
    )
    cases["nan_gc_threshold"] = Case(
        shaped(lambda s: s.update(allocator_settings={"garbage_collection_threshold": float("inf")})),
        "snapshot:schema:non-finite",
    )
    cases["bad_pool_id"] = Case(
        shaped(lambda s: s["segments"][0].update(segment_pool_id=(1, 2, 3))), "snapshot:schema:bad-pool-id"
    )
    cases["settings_nested_list"] = Case(
        shaped(lambda s: s.update(allocator_settings={"x": [[1]]})), "snapshot:schema:wrong-type"
    )
    cases["json_shape"] = Case(
        json.dumps({"segments": [], "device_traces": [[{"action": 3}]]}).encode(), "snapshot:schema:wrong-type"
    )
    return cases


def _nest(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _garbage_in_last_frame() -> bytes:
    """A protocol-4 pickle whose only frame carries bytes after STOP (ending in '.')."""
    body = pickle.dumps({"segments": []}, protocol=4)
    assert body[2] == 0x95  # FRAME
    (length,) = struct.unpack("<Q", body[3:11])
    extra = b"\x80\x02cos\nsystem\n."
    return body[:3] + struct.pack("<Q", length + len(extra)) + body[11:] + extra
