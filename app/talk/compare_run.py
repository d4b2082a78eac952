"""The app's comparisons: the stored result at once when a preset opens, and a live run (M, or every
preset with Load → Prepare the talk) in the engine thread, on engines of its own.

The live load waits while a comparison runs (its generator stopped, its requests aborted) so that no
live request's latency counts the comparison's work, and the comparison engines publish nothing to the
live panels. Results are stored per machine, model and [compare] section (app/talk/compare/store.py), the
same store `inferlab prepare` fills.
"""
from __future__ import annotations

import time

from app.source import channel
from app.talk.compare.job import ComparisonJob, comparison_base
from app.talk.compare.machine import machine_info
from app.talk.compare.profile import changed_since_prepare, read_manifest
from app.talk.compare.store import load_stored, result_path


def stored_result(preset, model: str, threads: int | None) -> dict | None:
    """The stored result of `preset` measured on this machine with the engine's thread count, in this
    process's profile; "store_note" says when it is not what the last `inferlab prepare` there wrote."""
    if preset.compare is None:
        return None
    machine = machine_info()
    machine["threads"] = threads or machine["threads"]
    result = load_stored(preset.name, model, machine, fingerprint=preset.compare.fingerprint())
    if result is not None:  # the title does not shape the result: the preset's current one is shown
        result["title"] = preset.compare.title
        path = result_path(preset.name, model, machine)
        note = changed_since_prepare(path, preset.name)
        if note:
            result["store_note"] = note
        manifest = read_manifest(path.parent)
        if manifest is not None:  # which prepare this store holds: the app remembers the last one it showed
            result["prepared"] = {"id": manifest["prepare_id"], "at": manifest["prepared_at"],
                                  "by": manifest["by"], "store": str(path.parent)}
    return result


class ComparisonRun:
    """Run as ComparisonRun(presets, model)(host) in the engine thread: each preset's comparison in turn,
    a channel.ComparisonResult for each, channel.Busy progress, the live load restored after."""

    def __init__(self, presets: list, model: str) -> None:
        self.jobs = [ComparisonJob(p, model) for p in presets if p.compare is not None]

    def __call__(self, host) -> None:
        from engine.loading.loader import load_model

        was_running = host.loadgen.running
        host.loadgen.stop()
        host.abort_all(only_ours=True)
        cancelled = lambda: host.stopping or host.measurement_cancelled.is_set()  # noqa: E731
        try:
            host.publish(channel.Busy("comparison: loading the weights for its own engines…", None))
            cfg = host.engine.config
            loaded = load_model(cfg.model)
            base = comparison_base(cfg.model, cfg.dtype, cfg.device, cfg.num_threads)
            for i, job in enumerate(self.jobs):
                if cancelled():
                    break
                name, n = job.preset.name, len(self.jobs)

                def progress(text: str, fraction: float, i=i, name=name, n=n) -> None:
                    host.publish(channel.Busy(f"comparison {name} ({i + 1}/{n}): {text}", (i + fraction) / n))

                try:
                    result = job(loaded, base, progress, cancelled)
                except Exception as exc:  # one preset's failure is reported; the rest still run
                    host.publish(channel.Message(f"comparison {name} failed: {type(exc).__name__}: {exc}"))
                    continue
                host.publish(channel.ComparisonResult(name, result))
        finally:
            if was_running and not cancelled():
                host.loadgen.start(time.perf_counter())
            host.publish(channel.Busy("", None))
