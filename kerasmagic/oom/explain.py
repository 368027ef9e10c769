"""Word an out-of-memory error: the device, its allocator, what holds the memory, one remedy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kerasmagic.oom.detect import OomError
from kerasmagic.oom.facts import Figures, OomFacts
from kerasmagic.oom.limits import is_cpu
from kerasmagic.units import fmt_bytes

if TYPE_CHECKING:
    from kerasmagic.cleanup.holders import LiveModel

LABELS = {"tensorflow": "TensorFlow", "torch": "PyTorch", "jax": "JAX"}
FIND_BATCH = "kerasmagic.find_batch_size(model, x, y) finds the largest batch that fits"


def explain(
    oom: OomError, figures: Figures, models: Sequence[LiveModel], isolated_pid: int | None = None
) -> tuple[str, OomFacts]:
    """Return the lines printed after an out-of-memory traceback, and the record's facts.

    With ``isolated_pid`` the error came from that ``%%fresh_model --isolate`` child: its
    figures are the child's at the failure, and its memory went with it.
    """
    where = figures.device or oom.device or "the device"
    label = LABELS.get(oom.backend, oom.backend)
    child = f", in isolated process {isolated_pid}" if isolated_pid is not None else ""
    lines = [f"kerasmagic: out of memory on {where} ({label}){child}"]
    if oom.wanted_bytes is not None:
        what = f"a {oom.dtype} tensor of shape {list(oom.shape)}" if oom.shape else "one block"
        lines.append(f"  wanted     {fmt_bytes(oom.wanted_bytes)} for {what}")
    lines.append(f"  allocator  {_allocator_line(figures, label)}")
    if isolated_pid is not None:
        lines.append("  after      that process has ended, and its memory with it: this kernel "
                     "holds none of it")  # fmt: skip
    ranked = sorted(models, key=lambda m: (not m.freeable, -m.size_bytes))
    for m in ranked[:5]:
        state = "freeable" if m.freeable else "kept"
        held = ", ".join(m.holders[:3]) or "nothing in the namespace"
        lines.append(
            f"  held by    {m.type} {m.name!r} {fmt_bytes(m.size_bytes)} ({state}): {held}"
        )
    said = remedy(oom, figures, ranked, isolated_pid is not None)
    lines.append(f"  remedy     {said}")
    return "\n".join(lines), OomFacts.of(oom, figures, said, isolated_pid is not None)


def _allocator_line(f: Figures, label: str) -> str:
    """Return the allocator's figures in words, or why there are none."""
    limit = f"limit {fmt_bytes(f.limit_bytes)}" if f.limit_bytes is not None else None
    if limit and f.limit_source:
        limit += f" ({f.limit_source})"
    figures = [f"in use {fmt_bytes(f.in_use_bytes)}" if f.in_use_bytes is not None else None,
               f"peak {fmt_bytes(f.peak_bytes)}" if f.peak_bytes is not None else None,
               limit]  # fmt: skip
    if f.in_use_bytes is None and f.peak_bytes is None:
        none = f"no allocator figures ({label} keeps none on {f.device or 'this device'})"
        rss = f"process RSS {fmt_bytes(f.rss_bytes)}" if f.rss_bytes is not None else None
        return "; ".join(x for x in (none, rss, limit) if x)
    return ", ".join(x for x in figures if x)


def remedy(oom: OomError, f: Figures, models: Sequence[LiveModel], isolated: bool = False) -> str:
    """Return the one remedy that the figures point to."""
    stale = [m for m in models if m.freeable]
    wanted, limit, in_use = oom.wanted_bytes, f.limit_bytes, f.in_use_bytes
    if stale and not isolated:
        freed = sum(m.size_bytes for m in stale)
        return (
            f"%%fresh_model on this cell (or kerasmagic.reset()) frees {fmt_bytes(freed)} held "
            f"by {len(stale)} earlier model{'s' if len(stale) > 1 else ''}, then re-run it"
        )
    if wanted is not None and limit is not None and wanted > limit:
        whole = "the host's RAM" if is_cpu(f.device) and f.limit_source == "host RAM" else (
            "the whole device")  # fmt: skip
        return (
            f"this one allocation needs more than {whole} ({fmt_bytes(limit)}): make it "
            "smaller (a smaller batch, layer or input)"
        )
    if isolated:
        return (
            "the isolated process started with nothing else on the device and still ran out: "
            f"use a smaller batch or model ({FIND_BATCH}, in the isolated cell)"
        )
    if wanted is not None and limit is not None and in_use is not None and in_use + wanted < limit:
        return (
            f"{fmt_bytes(limit - in_use)} is free but in pieces smaller than this tensor (the "
            "allocator keeps the regions it took): a smaller tensor fits; only a new process "
            "(%%fresh_model --isolate, or a restart) joins them again"
        )
    if wanted is not None and limit is not None and in_use is not None and oom.shape:
        free = max(0, limit - in_use)
        batch = oom.shape[0]
        fits = int(batch * free / wanted) if wanted else batch
        if 0 < fits < batch:
            return (
                f"a tensor of {batch} rows did not fit in {fmt_bytes(free)} free: batch <= {fits}"
            )
    return (
        "the memory is held by what you keep: del what you no longer need, then "
        f"kerasmagic.reset(), or use a smaller batch ({FIND_BATCH})"
    )
