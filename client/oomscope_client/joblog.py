"""The verdict in the job log: what filled the device and why, printed by the rank that died.

``dump_on_oom`` calls ``print_verdict`` once the dump is written. The report comes from the first of:

1. the analysis library (``analysis.report.build_report``, from the oomscope repository), when it is
   importable on the training machine: the report is made right there, from the dump and its sidecar;
2. the site, when the dumper uploads and its ``upload`` spec says ``wait`` (seconds): the upload's
   analysis is waited for and its report read back (``GET /api/v1/snapshots/<id>/report``);
3. neither: the block says how to get the verdict (the two commands).

Each block is one ``write`` to standard error, every line prefixed with the rank (``oomscope[rank 1]:``),
so that the ranks' blocks stay apart and greppable when torchrun interleaves their output.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

TOP_STACKS = 3


def size(n: float | None) -> str:
    """A size in the report's own wording (``analysis.readout.size``, which the client cannot import:
    it needs the stdlib only): bytes up to 1 KiB, KiB, MiB up to 1 GiB inclusive, GiB, two decimals."""
    if n is None:
        return "n/a"
    value = abs(float(n))
    sign = "-" if n < 0 else ""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value > scale:
            return f"{sign}{value / scale:.2f} {unit}"
    return f"{sign}{int(value)} bytes"


def main_device(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The device the block speaks of: the one that ran out of memory, else the largest peak."""
    devices = report.get("devices") or []
    if not devices:
        return None

    def weight(d: Mapping[str, Any]) -> tuple[int, int]:
        return (1 if d.get("oom") else 0, int((d.get("summary") or {}).get("peak_reserved_bytes") or 0))

    return max(devices, key=weight)


def prefix(job: Mapping[str, Any]) -> str:
    rank = job.get("rank")
    return "oomscope:" if rank is None else f"oomscope[rank {rank}]:"


def header(job: Mapping[str, Any], what: str) -> str:
    """``==== rank 0 of 2 (local rank 0, host vm): CUDA out of memory ====`` (no rank: a lone process)."""
    rank, world, local, host = (job.get(k) for k in ("rank", "world_size", "local_rank", "host"))
    where = [f"local rank {local}"] if local is not None else []
    where += [f"host {host}"] if host else []
    who = f"rank {rank}" + (f" of {world}" if world else "") if rank is not None else "this process"
    return f"==== {who}" + (f" ({', '.join(where)})" if where else "") + f": {what} ===="


def verdict_lines(report: Mapping[str, Any], source: str) -> list[str]:
    """The report's headline, its change and the top stacks where it failed (or at the peak)."""
    dev = main_device(report)
    if dev is None:
        return [f"no device in the snapshot: nothing was recorded ({source})"]
    decision = dev.get("decision") or {}
    change = decision.get("change") or {}
    lines = [str(decision.get("headline") or "no verdict: the report has no decision for this device")]
    lines.append(f"change: {change['line']}" if change.get("line") else "change: none the figures support")
    when = "oom" if dev.get("oom") else "peak"
    rows = [row for row in dev.get("top_stacks") or [] if row.get("when") == when][:TOP_STACKS]
    if rows:
        lines.append("top stacks at the OOM:" if when == "oom" else "top stacks at the peak:")
        lines.extend(f"  {size(row.get('bytes')):>11}  {row.get('label') or '(no frames)'}" for row in rows)
    for finding in (report.get("capture") or {}).get("doctor") or []:
        lines.append(f"capture: {finding.get('problem')}; next time: {finding.get('fix')}")
    lines.append(source)
    return lines


def how_to_get_it(path: Path) -> list[str]:
    """The block when neither the library nor a site gave the verdict."""
    return [
        "no verdict here: the oomscope analysis library is not importable on this machine, and no upload waits",
        f"get it with: python -m analysis report {path}   (from the oomscope repository)",
        f"         or: python -m oomscope_client upload {path} --project P --wait",
        "         or: dump_on_oom(..., upload={..., 'wait': 600}) to print the site's verdict here",
    ]


def local_report(path: Path, sidecar: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The report made here by the analysis library; None when it is not importable."""
    try:
        from analysis.report import build_report  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    side = dict(sidecar or {})
    message = side.get("oom_message") if isinstance(side.get("oom_message"), str) else None
    return build_report(path, filename=path.name, sidecar=side, oom_message=message)  # type: ignore[no-any-return]


def site_report(upload_result: Mapping[str, Any], token: str, timeout: float) -> tuple[dict[str, Any], str]:
    """Wait for the upload's analysis on the site; its report and the report page's URL."""
    from oomscope_client.upload import UploadError, snapshot_status, wait_for_analysis

    api_url = str(upload_result.get("api_url") or "")
    body = wait_for_analysis(api_url, token, timeout=timeout)
    if body.get("status") != "done":
        error = body.get("error") or {}
        raise UploadError(f"the site's analysis failed: {error.get('code')}: {error.get('message')}")
    return snapshot_status(api_url.rstrip("/") + "/report", token), str(body.get("url") or "")


def write_block(job: Mapping[str, Any], what: str, lines: Sequence[str], stream: TextIO | None = None) -> None:
    """One write, every line prefixed with the rank: the ranks' blocks stay whole in a shared log."""
    mark = prefix(job)
    body = [header(job, what), *lines, "=" * 4 + " end of the oomscope verdict " + "=" * 4]
    out = stream or sys.stderr
    out.write("".join(f"{mark} {line}\n" for line in body))
    out.flush()
