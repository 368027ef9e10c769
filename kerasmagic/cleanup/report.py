"""``CleanupReport``: what one cleanup dropped and freed, and which models are still alive."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kerasmagic.units import fmt_bytes, signed_bytes


@dataclass(frozen=True)
class CleanupReport:
    """What one cleanup dropped, what it freed, and which models are still alive and why."""

    dropped: tuple[str, ...]
    kept: tuple[str, ...]
    not_freed: tuple[str, ...]
    freed_bytes: int
    tf_freed_bytes: int | None
    released: tuple[str, ...]  # what the backends released around the collection, in words
    elapsed_s: float
    dry_run: bool = False
    notes: tuple[str, ...] = ()
    stale_models: int = 0  # models the cleanup set out to free (freed_bytes / this: per model)
    steps: tuple[tuple[str, float], ...] = ()  # each step's name and seconds

    def summary(self) -> str:
        """Return the one-line report shown after a ``%%fresh_model`` cell."""
        if self.dry_run:
            return f"dry run: would drop {_names(self.dropped)}; would keep {_names(self.kept)}"
        parts = [f"{self._freed()} in {self.elapsed_s:.2f} s"]
        parts.append(f"dropped {_names(self.dropped)}")
        parts += self.released
        if self.kept:
            parts.append(f"still alive: {_names(self.kept)}")
        if self.not_freed:
            parts.append(f"NOT freed: {_names(self.not_freed)}")
        return "; ".join(parts + list(self.notes))

    def _freed(self) -> str:
        """Say what was freed, in units that show it (12.0 KB, not 0.0 MB); RAM freed while
        nothing was dropped is what earlier cells left for the collector."""
        ram = f"freed {fmt_bytes(self.freed_bytes)} of RAM" if self.freed_bytes > 0 else ""
        if ram and not self.dropped:
            ram += " (garbage earlier cells left)"
        tf = self.tf_freed_bytes  # None: no allocator statistics
        tensors = f"{fmt_bytes(tf)} of TensorFlow tensors" if tf is not None and tf > 0 else ""
        if ram and tensors:
            return f"{ram} and {tensors}"
        return ram or (f"freed {tensors}" if tensors else "freed no memory")

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict (for the sidebar and logs)."""
        return dataclasses.asdict(self)


def _names(items: tuple[str, ...], limit: int = 6) -> str:
    if not items:
        return "nothing"
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def report_text(report: CleanupReport, after_cleanup_rss: int, record: Any, now: int) -> str:
    """Return a ``%%fresh_model`` cell's line once the cell is recorded: the cleanup, what the
    cell then took, and the net change over the whole cell, which is the cell's record (the
    badge under it, the sidebar's chart): freed and took, measured apart, add up to it. Without
    a record (its snapshot failed) what the cell took is read from ``now``, RSS at the end."""
    if record is None:
        return f"{report.summary()}; {_cell_then(now - after_cleanup_rss)} of RAM"
    took = record.end.ram.rss_bytes - after_cleanup_rss
    net = record.delta.rss_bytes
    return f"{report.summary()}; {_cell_then(took)} of RAM, {signed_bytes(net)} for the whole cell"


def _cell_then(took: int) -> str:
    """What the cell's own code did to RSS after the cleanup: took +X, or gave X back."""
    if took < 0:
        return f"the cell then gave back {fmt_bytes(-took)}"
    return f"the cell then took {signed_bytes(took)}"
