"""The report: every analysis of a snapshot assembled into the contract JSON.

``build_report(source)`` reads a snapshot, replays each device's trace once
(``analysis.allocator.recording``), runs the what-if replays (``analysis.allocator``)
and the analyses of this package, and returns a plain dict (``schema:
"oomscope.report/1"``, see ../shared/docs/contract.md and docs/report.md for
the keys beyond the contract). Bytes are ints, addresses hex strings, and
nothing in it needs more than ``json.dumps``.

This module only wires the stages of ``analysis/stages/``: each takes typed inputs and returns a
frozen result that the next take, and the contract entry is written once, from them
(``stages.serialise``; docs/architecture.md, "The report's stages"). The ``whatif`` command
(``build_whatif``) reaches its answer through the same stages.

Work per device is a handful of numpy passes over the replay's columns; the
only per-event Python loops are inside the replays themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from analysis.stages import (
    attribution,
    diagnosis,
    explain,
    finish,
    outline,
    replays,
    serialise,
    whatifs,
    workload,
)
from analysis.stages import source as snapshot_source

SCHEMA = "oomscope.report/1"
Progress = Callable[[str, float], None]


def _noop(stage: str, fraction: float) -> None:
    return None


# ------------------------------------------------------------------ entry points


def build_report(
    source: str | Path | bytes,
    *,
    whatif: Iterable[str] = (),
    limit: int | None = None,
    progress: Progress | None = None,
    filename: str | None = None,
    jobs: int = 1,
    oom_message: str | None = None,
    sidecar: dict[str, Any] | None = None,
    batch_size: int | None = None,
    explore: replays.Sink | None = None,
    explore_later: replays.LaterSink | None = None,
) -> dict[str, Any]:
    """The contract report for a snapshot file (path or bytes).

    ``explore``, when given, is called once per analysed device with ``(device, store)``:
    ``analysis.explore.explore_store`` made from this report's own recorded replay (its
    checkpoints kept by the same pass), what the site's digging endpoints read. ``explore_later``
    is called instead with ``(device, make)``: ``make()`` gives that store, once the caller has
    done with the report (the worker's child writes the report first: issue 34).

    ``batch_size`` (the failing step's batch, where the user knows it) turns the batch-fit
    fraction into a number of samples (``analysis.sizing``).

    With ``jobs`` > 1 the policy replays (the check and the what-ifs) run in up
    to that many threads (compiled loops) or forked child processes (Python loops)
    beside the rest (``analysis.parallel``); the report is the same. ``oom_message``
    is torch's OOM message as the user
    has it, ``sidecar`` the client's sidecar JSON (``oomscope_client``): both give
    the real limit (``analysis.limits``); a text that is not an OOM message
    raises ``OomMessageError`` before any heavy work.
    """
    with replays.running(jobs, explore, explore_later) as runner:
        inputs = snapshot_source.checked_inputs(tuple(whatif), oom_message, sidecar, limit=limit, batch_size=batch_size)
        report_progress = progress or _noop
        report_progress("reading", 0.0)
        # The file's hash may go on beside the stages where no child is forked (``source.read``).
        src = snapshot_source.read(source, filename, hash_later=not runner.pool.forks)
        report_progress("reading", 1.0)
        outcomes = []
        for k in range(len(src.devices)):

            def dev_progress(stage: str, f: float, k: int = k) -> None:
                report_progress(stage, (k + f) / max(1, len(src.devices)))

            outcomes.append(_analyse_device(src, k, inputs, runner, dev_progress))
        capture = finish.capture_section(src, inputs.message, outcomes)
        for dev, outcome in zip(src.devices, outcomes, strict=True):
            finish.finish_device(outcome, dev, capture, inputs.batch_size)
        finish.doctor_into(capture, outcomes, inputs.sidecar)
        report_progress("analysing", 1.0)
        return {
            "schema": SCHEMA,
            "source": src.section(),
            "capture": capture,
            "devices": [o.entry for o in outcomes],
            "annotations": len(src.snapshot.annotations),
            "pools": [list(p) for p in src.snapshot.pools],
        }


def build_whatif(
    source: str | Path | bytes,
    config: str,
    *,
    limit: int | None = None,
    filename: str | None = None,
    oom_message: str | None = None,
) -> dict[str, Any]:
    """``python -m analysis whatif``: one configuration replayed on every device with a trace, under
    what the report's own what-ifs replay under (the same stages: ``whatifs.command_item``)."""
    inputs = snapshot_source.checked_inputs((config,), oom_message, None, limit=limit)
    src = snapshot_source.read(source, filename)
    out = [
        whatifs.command_item(src.snapshot, dev, config, limit, src.message_for(inputs.message, dev.device))
        for dev in src.snapshot.devices
        if len(dev.trace)
    ]
    return {"schema": SCHEMA, "source": src.section(), "config": config, "devices": out}


# ------------------------------------------------------------------ one device: the stages, in order


def _analyse_device(
    src: snapshot_source.Source,
    k: int,
    inputs: snapshot_source.Inputs,
    runner: replays.Runner,
    progress: Progress,
) -> finish.DeviceOutcome:
    """All analyses of one device, stage after stage (docs/architecture.md, "The report's stages").
    The causes, the entry and the advisor's input read no what-if: they are made while the what-if
    replays may still run (the last to finish), whose keys are filled in once they are in."""
    snapshot, dev, catalog, pool = src.snapshot, src.devices[k], src.catalog, runner.pool
    message = src.message_for(inputs.message, dev.device)
    user = list(inputs.whatifs)
    warnings: list[tuple[str, str]] = []
    progress("replaying", 0.0)
    seen = outline.trace_outline(snapshot, dev, inputs.limit, message, inputs.sidecar)
    started = replays.start(snapshot, seen, pool, user, warnings)
    facts = outline.trace_facts(snapshot, seen, checkpoints=runner.keeps_checkpoints)
    recorded, check, planned = replays.record(snapshot, facts, started, pool, user, warnings)
    progress("replaying", 0.5)
    explained = explain.explain(snapshot, facts, recorded, message, warnings)
    if planned is None:
        assert explained.limit is not None
        planned = whatifs.submit_whatifs(
            pool, snapshot, facts, facts.projection, recorded.requests, user, explained.limit, warnings
        )
    timeline = serialise.timeline_json(facts, recorded, catalog)
    progress("replaying", 1.0)
    progress("analysing", 0.0)
    attributed = attribution.attribute(snapshot, facts, recorded.replay, catalog)
    progress("analysing", 0.3)
    phases = diagnosis.device_phases(snapshot, facts, catalog, attributed)
    diagnosed = diagnosis.diagnose_device(snapshot, facts, recorded, catalog, attributed, explained, message, phases)
    progress("analysing", 0.5)
    ledger = diagnosis.ledger_of(snapshot, facts, recorded.replay, catalog, message)
    entry = serialise.device_json(facts, recorded, explained, attributed, diagnosed, timeline, catalog, ledger)
    entry["signature"] = diagnosis.signature_of(facts, catalog, attributed, phases)
    advice = workload.advice_context(snapshot, facts, recorded, attributed, src.size, catalog)
    collected = whatifs.collect_whatifs(planned)
    grown = diagnosis.growth_per_step(diagnosed)
    whatifs.add_grown_horizons(snapshot, facts.dev, collected, grown, recorded.requests)
    progress("analysing", 0.8)
    oom = serialise.oom_json(facts, explained, attributed, collected) if explained.oom is not None else None
    serialise.with_replays(entry, oom, collected, check.result())
    advice.oom, advice.whatifs = oom, collected.advice
    replays.explore_into(runner, snapshot, facts, catalog, recorded)
    progress("analysing", 1.0)
    return finish.DeviceOutcome(
        entry,
        advice,
        facts.oom_index,
        recorded.replay.trace_complete,
        tuple(recorded.replay.warnings),
        tuple(warnings),
        finish.sizing_input(entry, diagnosed),
    )
