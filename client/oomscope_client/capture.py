"""Record allocator history and write snapshots, the OOM one in particular.

torch is imported inside each function, never at module import, so the package (and its
uploader) stays importable where torch is absent.

Why the OOM observer is attached lazily: ``torch._C._cuda_attach_out_of_memory_observer``
reaches into the per-device allocators, which exist only once CUDA is initialised; calling it
earlier crashed in several releases (pytorch/pytorch#102796, #107330). ``torch.cuda._lazy_call``
runs the attach right away when CUDA is up and otherwise queues it to run just after CUDA's
lazy init, i.e. before the first allocation can fail.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, Union

SIDECAR_FORMAT = "oomscope-client-sidecar/1"


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # the uploader needs no torch; these functions do
        raise ImportError("oomscope_client: this function needs PyTorch (import torch failed)") from e
    return torch


# --------------------------------------------------------------------------- recording


class Recording:
    """History recording started by ``record``; a context manager that stops it on exit.

    Stopping discards the recorded history (that is how torch turns it off), so dump first.
    """

    def __init__(
        self, options: dict[str, Any], *, events_per_step: int | None = None, allocated_before: int = 0
    ) -> None:
        self.options = options
        self.active = True
        # Measured by ``record(dry_step=...)``: the events one step records (what ``max_entries`` was sized from).
        self.events_per_step = events_per_step
        self.allocated_before = allocated_before

    def facts(self) -> dict[str, Any]:
        """How recording was started, for the dump's sidecar (the capture doctor reads it)."""
        return {
            **self.options,
            "events_per_step": self.events_per_step,
            "allocated_before": self.allocated_before,
            "active": self.active,
        }

    def dump(self, path: str | os.PathLike[str]) -> Path:
        return dump_snapshot(path)

    def stop(self) -> None:
        if self.active:
            _torch().cuda.memory._record_memory_history(enabled=None)
            self.active = False

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# The ring's size while ``record(dry_step=...)`` counts one step's events.
DRY_STEP_MAX_ENTRIES = 10_000_000
_current: Recording | None = None  # the recording ``record`` started last (its facts go into each dump's sidecar)


def record(
    max_entries: int = 1_000_000,
    stacks: str = "python",
    context: str | None = "all",
    *,
    enabled: str = "all",
    dry_step: Callable[[], Any] | None = None,
    steps_kept: int = 100,
) -> Recording:
    """Start recording CUDA allocator history (``torch.cuda.memory._record_memory_history``).

    Call it before the first CUDA allocation: blocks allocated earlier appear in the
    snapshot without history or stacks, and peaks computed from the trace miss them.
    ``stacks="python"`` keeps dumps fast; ``"all"`` adds C++ frames at a large cost.

    ``dry_step`` (a callable running one training step) sizes the ring buffer: recording starts with
    room for ``DRY_STEP_MAX_ENTRIES`` events, the step runs, and ``max_entries`` becomes what keeps
    ``steps_kept`` such steps (``doctor.sized_max_entries``); recording then goes on with the new size and
    the dry step's history kept (torch's ``clear_history`` stays False). A ring too small for one step
    drops the start of every step, the most common way a capture looks valid and answers nothing.
    """
    global _current
    from oomscope_client.doctor import sized_max_entries

    torch = _torch()
    before = int(torch.cuda.memory_allocated()) if torch.cuda.is_initialized() else 0
    if before > 0:
        warnings.warn(
            f"oomscope_client.record: {before} bytes were allocated before "
            "recording started; they will have no history in the snapshot",
            stacklevel=2,
        )
    options = {"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries}
    per_step = None
    if dry_step is not None:
        torch.cuda.memory._record_memory_history(**{**options, "max_entries": DRY_STEP_MAX_ENTRIES})
        start = _events_recorded(torch)
        dry_step()
        per_step = _events_recorded(torch) - start
        options["max_entries"] = sized_max_entries(per_step, steps_kept)
    torch.cuda.memory._record_memory_history(**options)
    _current = Recording(options, events_per_step=per_step, allocated_before=before)
    return _current


def _events_recorded(torch: Any) -> int:
    return sum(len(trace) for trace in torch.cuda.memory._snapshot().get("device_traces") or [])


# --------------------------------------------------------------------------- dumping


def _write_atomically(path: Path, write: Callable[[Any], None], *, compress: bool) -> None:
    # A crash or a full disk mid-dump must not leave a truncated file under the final name.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if compress:
            with gzip.open(tmp, "wb", compresslevel=6) as f:
                write(f)
        else:
            with tmp.open("wb") as f:
                write(f)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _write_sidecar(path: Path, data: Mapping[str, Any]) -> None:
    # Replaced whole, never truncated in place: the upload thread reads it while the training thread updates
    # it after the exception (a reader once met the empty file: "Expecting value: line 1 column 1").
    text = json.dumps(data, indent=1, default=str).encode()
    _write_atomically(path, lambda f: f.write(text), compress=False)


def dump_snapshot(path: str | os.PathLike[str], *, compress: bool | None = None) -> Path:
    """Write ``torch.cuda.memory._snapshot()`` as a pickle (gzipped when the name ends in .gz)."""
    path = Path(path)
    snapshot = _torch().cuda.memory._snapshot()
    compress = path.name.endswith(".gz") if compress is None else compress
    _write_atomically(path, lambda f: pickle.dump(snapshot, f, protocol=4), compress=compress)
    return path


def _describe_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    traces = snapshot.get("device_traces", [])
    return {"snapshot_keys": sorted(snapshot), "n_trace_events": [len(t) for t in traces]}


def state_facts(torch: Any, device: int | None = None) -> dict[str, Any]:
    """What the process knows about its own memory now: the truth the snapshot can be checked against."""
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", "")),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
    }
    if torch.cuda.is_initialized():
        current = torch.cuda.current_device() if device is None else device
        facts["device"] = torch.cuda.get_device_name(current)
        facts["total_memory"] = torch.cuda.get_device_properties(current).total_memory
        facts["memory_stats"] = dict(torch.cuda.memory_stats(current))
        facts["memory_stats_per_device"] = [dict(torch.cuda.memory_stats(i)) for i in range(torch.cuda.device_count())]
    return facts


def _num_ooms(torch: Any) -> int:
    return sum(int(torch.cuda.memory_stats(i).get("num_ooms", 0)) for i in range(torch.cuda.device_count()))


# --------------------------------------------------------------------------- OOM dumps


# typing.Union and timezone.utc keep the client importable on Python 3.9/3.10 training images
UploadSpec = Union[Callable[[Path], Any], Mapping[str, Any]]  # noqa: UP007


class OomDumper:
    """Writes a snapshot and a JSON sidecar when a CUDA OOM happens; see ``dump_on_oom``."""

    def __init__(
        self,
        path_dir: str | os.PathLike[str],
        upload: UploadSpec | None = None,
        *,
        compress: bool = True,
        prefix: str = "oom",
        max_dumps: int = 1,
        dump_errors: bool | None = None,
        verdict: bool = True,
    ) -> None:
        self.path_dir = Path(path_dir)
        # Print the verdict in the job log once a dump is written (joblog.py says from where).
        self.verdict = verdict
        # Where the snapshot comes from: torch's ``_snapshot()`` unless set (tests stand a real
        # capture in here, on machines without a GPU).
        self.snapshot_source: Callable[[], dict[str, Any]] | None = None
        # The job this process is a rank of (launcher environment, git): read once, not at the OOM.
        self.job: dict[str, Any] = {}
        # Dump on any uncaught error too, not only an OOM: in a job of several ranks, the ranks
        # whose collective failed when a peer died are half of the story (None: when world_size > 1).
        self.dump_errors = dump_errors
        self.upload_spec = upload
        self.compress = compress
        self.prefix = prefix
        self.max_dumps = max_dumps
        self.paths: list[Path] = []
        self.sidecars: list[Path] = []
        self.uploads: list[Any] = []
        self.upload_results: dict[Path, Any] = {}
        self._verdicts_printed: set[Path] = set()
        self.observer_attached = False
        self.enabled = False
        self._dumped_at_ooms: int | None = None
        self._lock = threading.RLock()
        self._threads: list[threading.Thread] = []
        self._previous_excepthook: Any = None

    # -- installation

    def install(self, *, observer: bool = True, excepthook: bool = True) -> OomDumper:
        from oomscope_client.jobmeta import job_metadata

        torch = _torch()
        self.path_dir.mkdir(parents=True, exist_ok=True)
        self.job = job_metadata()
        if self.dump_errors is None:
            self.dump_errors = int(self.job.get("world_size") or 1) > 1
        self.enabled = True
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if observer and attach is not None:

            def attach_now() -> None:
                try:
                    attach(self._on_observer)
                    self.observer_attached = True
                except Exception as e:  # the exception path below still dumps
                    warnings.warn(f"oomscope_client: cannot attach the OOM observer: {e}", stacklevel=1)

            lazy_call = getattr(torch.cuda, "_lazy_call", None)
            if torch.cuda.is_initialized() or lazy_call is None:
                if torch.cuda.is_initialized():
                    attach_now()
            else:
                lazy_call(attach_now)
        if excepthook:
            self._previous_excepthook = sys.excepthook
            sys.excepthook = self._excepthook
        return self

    def uninstall(self) -> None:
        """Stop dumping. torch has no call to detach an observer, so it stays but does nothing."""
        self.enabled = False
        if self._previous_excepthook is not None and sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        self._previous_excepthook = None

    # -- the two ways an OOM reaches us

    def _on_observer(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        # Runs inside the allocator's failing malloc (lock released, GIL held), before the
        # exception unwinds: every tensor that filled the memory is still alive. Never raise here.
        try:
            observed = {
                "device": int(device),
                "alloc_bytes": int(alloc),
                # the per-process cap when a memory fraction is set, else the device's total
                "allowed_bytes": int(device_alloc),
                "device_free_bytes": int(device_free),
            }
            self._dump("observer", observed=observed)
        except Exception as e:
            warnings.warn(f"oomscope_client: OOM dump from the observer failed: {e}", stacklevel=1)

    def handle_exception(self, exc: BaseException) -> Path | None:
        """Dump for an ``OutOfMemoryError`` unless the observer already did for this OOM.

        Either way, the sidecar of that OOM gets the exception's message.
        """
        if not self.enabled:
            return None
        torch = _torch()
        if not isinstance(exc, torch.cuda.OutOfMemoryError):
            if self.dump_errors and isinstance(exc, Exception):
                with self._lock:
                    dumped = self._dump("error", error=f"{type(exc).__name__}: {exc}")
                if dumped is not None and self.verdict:
                    self.print_verdict(dumped)
                return dumped
            return None
        with self._lock:
            if self._dumped_at_ooms is not None and self._dumped_at_ooms == _num_ooms(torch) and self.sidecars:
                self._update_sidecar(self.sidecars[-1], {"oom_message": str(exc)})
                path: Path | None = self.paths[-1]
            else:
                path = self._dump("exception", message=str(exc))
        if path is not None and self.verdict:
            self.print_verdict(path)
        return path

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        try:
            if "torch" in sys.modules:
                self.handle_exception(exc)
        except Exception as e:
            warnings.warn(f"oomscope_client: OOM dump from excepthook failed: {e}", stacklevel=1)
        previous = self._previous_excepthook or sys.__excepthook__
        previous(exc_type, exc, tb)

    def __enter__(self) -> OomDumper:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None:
            try:
                self.handle_exception(exc)
            except Exception as e:
                warnings.warn(f"oomscope_client: OOM dump failed: {e}", stacklevel=1)
        # the OOM (or any other exception) propagates unchanged

    # -- writing

    def _dump(
        self,
        trigger: str,
        *,
        observed: dict[str, Any] | None = None,
        message: str | None = None,
        error: str | None = None,
    ) -> Path | None:
        torch = _torch()
        with self._lock:
            if not self.enabled or len(self.paths) >= self.max_dumps:
                return None
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")  # noqa: UP017
            device = observed["device"] if observed else torch.cuda.current_device()
            stem = f"{self.prefix}-{socket.gethostname()}-pid{os.getpid()}-dev{device}-{stamp}-{len(self.paths)}"
            path = self.path_dir / (stem + (".pickle.gz" if self.compress else ".pickle"))
            t0 = time.monotonic()
            snapshot = self.snapshot_source() if self.snapshot_source else torch.cuda.memory._snapshot()
            raw = pickle.dumps(snapshot, protocol=4)
            _write_atomically(path, lambda f: f.write(raw), compress=self.compress)
            sidecar: dict[str, Any] = {
                "format": SIDECAR_FORMAT,
                "snapshot": path.name,
                "trigger": trigger,
                "created_at": datetime.now(timezone.utc).isoformat(),  # noqa: UP017
                "oom_message": message,
                "error": error,
                "observer": observed,
                # The rank, world size and job (analysis reads rank/world_size/error from here).
                **{key: self.job[key] for key in ("rank", "world_size", "local_rank") if key in self.job},
                "job": self.job,
                **state_facts(torch, device),
                "pickle_bytes": len(raw),
                **_describe_snapshot(snapshot),
                "dump_seconds": round(time.monotonic() - t0, 3),
                "history": _current.facts() if _current is not None else None,
            }
            sidecar_path = self.path_dir / (stem + ".json")
            _write_sidecar(sidecar_path, sidecar)
            self.paths.append(path)
            self.sidecars.append(sidecar_path)
            # torch counts the OOM (num_ooms) before calling observers, so the observer and the
            # exception of one OOM see the same count: that is how one OOM gives one dump.
            self._dumped_at_ooms = _num_ooms(torch)
        what = "CUDA OOM" if error is None else "error"
        print(f"oomscope_client: {what} snapshot written to {path}", file=sys.stderr, flush=True)
        if self.upload_spec is not None:
            self._start_upload(path, sidecar_path)
        return path

    def _update_sidecar(self, sidecar_path: Path, changes: dict[str, Any]) -> None:
        with self._lock:
            data = json.loads(sidecar_path.read_text())
            data.update(changes)
            _write_sidecar(sidecar_path, data)

    def _start_upload(self, path: Path, sidecar_path: Path) -> None:
        # A non-daemon thread: the training loop may catch the OOM and go on, so it must not
        # block for the upload, and the interpreter still waits for it before exiting.
        def run() -> None:
            # Ours, outside the handler: a broken install fails loudly, not as a failed upload.
            from oomscope_client.upload import upload

            try:
                spec = self.upload_spec
                if callable(spec):
                    result = spec(path)
                else:
                    result = upload(path, **self._upload_arguments(spec or {}, sidecar_path))
                self.uploads.append(result)
                self.upload_results[path] = result
                self._update_sidecar(sidecar_path, {"upload": result})
            except Exception as e:
                self.uploads.append(e)
                self.upload_results[path] = e
                self._update_sidecar(sidecar_path, {"upload_error": str(e)})
                print(f"oomscope_client: upload of {path} failed: {e}", file=sys.stderr, flush=True)

        thread = threading.Thread(target=run, name="oomscope-upload", daemon=False)
        self._threads.append(thread)
        thread.start()

    def _upload_arguments(self, spec: Mapping[str, Any], sidecar_path: Path) -> dict[str, Any]:
        """The spec's arguments, plus the job's metadata and this dump's error (the spec's own win);
        the run defaults to the job id, so every rank of one job lands in one run."""
        arguments = {k: v for k, v in spec.items() if k != "wait"}  # ``wait`` is the job log's, not upload()'s
        with self._lock:
            sidecar = json.loads(sidecar_path.read_text())
        meta = {**self.job, **({"error": sidecar["error"]} if sidecar.get("error") else {})}
        arguments["meta"] = {**meta, **dict(arguments.get("meta") or {})}
        if not arguments.get("run") and self.job.get("job_id"):
            arguments["run"] = self.job["job_id"]
        if not arguments.get("oom_message") and sidecar.get("oom_message"):
            arguments["oom_message"] = sidecar["oom_message"]
        return arguments

    def print_verdict(self, path: Path | None = None) -> None:
        """Print the verdict of a dump (default: the last) in the job log, once per dump; never raises."""
        from oomscope_client import joblog

        path = path or (self.paths[-1] if self.paths else None)
        if path is None or path in self._verdicts_printed:
            return
        self._verdicts_printed.add(path)
        sidecar_path = self.sidecars[self.paths.index(path)]
        with self._lock:
            sidecar = json.loads(sidecar_path.read_text())
        what = "CUDA out of memory" if sidecar.get("error") is None else f"died of {sidecar['error'][:200]}"
        try:
            lines = self._verdict_lines(path, sidecar)
        except Exception as e:  # the OOM must still reach the user unchanged
            lines = [f"the verdict could not be made: {type(e).__name__}: {e}", *joblog.how_to_get_it(path)]
        joblog.write_block(self.job, what, lines)

    def _verdict_lines(self, path: Path, sidecar: dict[str, Any]) -> list[str]:
        from oomscope_client import joblog

        report = joblog.local_report(path, sidecar)
        if report is not None:
            return joblog.verdict_lines(report, f"analysed here by the oomscope library; the dump: {path}")
        spec = self.upload_spec
        wait = spec.get("wait") if isinstance(spec, Mapping) else None
        if spec is None or not wait:
            from oomscope_client.doctor import problems

            doctor = [f"capture: {problem.line}" for problem in problems(path, sidecar)]
            return [*joblog.how_to_get_it(path), *doctor]
        seconds = 600.0 if wait is True else float(wait)
        self.wait(seconds)
        result = self.upload_results.get(path)
        if not isinstance(result, Mapping):
            return [f"the upload failed: {result}", *joblog.how_to_get_it(path)]
        report, url = joblog.site_report(result, str(spec.get("token")), seconds)
        return joblog.verdict_lines(report, f"report: {url}")

    def wait(self, timeout: float | None = None) -> None:
        """Wait for uploads started by dumps."""
        for thread in self._threads:
            thread.join(timeout)


def dump_on_oom(
    path_dir: str | os.PathLike[str],
    upload: UploadSpec | None = None,
    *,
    compress: bool = True,
    prefix: str = "oom",
    max_dumps: int = 1,
    observer: bool = True,
    excepthook: bool = True,
    dump_errors: bool | None = None,
    verdict: bool = True,
) -> OomDumper:
    """Dump a snapshot into ``path_dir`` when a CUDA allocation fails.

    Two paths lead to a dump, and one OOM gives one dump:
    - the allocator's OOM observer (attached once CUDA is initialised), which fires inside the
      failing allocation while every tensor is still alive;
    - the ``OutOfMemoryError`` itself: uncaught (``sys.excepthook``) or leaving a
      ``with dumper:`` block. This path also fills the sidecar's ``oom_message``.

    ``upload`` is either a callable taking the snapshot path or the keyword arguments of
    ``oomscope_client.upload`` (``url``, ``token``, ``project``, ``run``, ...); uploads run in a
    background thread. Start history with ``record()`` first, or the snapshot has no trace.

    In a job of several ranks (``WORLD_SIZE`` > 1, or ``dump_errors=True``) an uncaught error
    that is not an OOM dumps too, with its text as the sidecar's ``error``: the rank whose
    all-reduce failed because a peer died of an OOM then joins the run's report as "a peer died".
    The job's rank, world size, id, host, torch version, commit and branch (``jobmeta``) go into
    the sidecar and with the upload, whose run defaults to the job id.

    With ``verdict`` (the default) the rank then prints its verdict in the job log (``joblog``: the
    headline, the change and the top stacks, one block per rank, the rank in its header), from the
    analysis library when it is importable here, else from the site when ``upload`` has ``wait``
    (seconds), else how to get it. It is printed on the exception's route (uncaught, or leaving
    ``with dumper:``); a loop that catches the OOM itself calls ``dumper.print_verdict()``.
    """
    dumper = OomDumper(
        path_dir,
        upload,
        compress=compress,
        prefix=prefix,
        max_dumps=max_dumps,
        dump_errors=dump_errors,
        verdict=verdict,
    )
    return dumper.install(observer=observer, excepthook=excepthook)
