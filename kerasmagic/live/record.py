"""``CellRecord``: what the live monitor keeps per executed cell (JSON-able)."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kerasmagic.snapshot import MemorySnapshot, SnapshotDelta

if TYPE_CHECKING:
    from kerasmagic.oom.facts import OomFacts


@dataclass(frozen=True)
class CellRecord:
    """One executed cell: its snapshots at start and end, their delta, and in-cell peaks."""

    execution_count: int
    started_s: float
    duration_s: float
    start: MemorySnapshot
    end: MemorySnapshot
    delta: SnapshotDelta
    peak_rss_bytes: int
    peak_gpu_bytes: int | None
    source_hash: str = ""  # same cell source -> same hash; the leak detector groups by it
    mode: str = "plain"  # "fresh" under %%fresh_model, "isolate" with --isolate (advice.py)
    oom: OomFacts | None = None  # the cell ended in an out-of-memory error (kerasmagic.oom)

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict that ``json.dumps`` accepts."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["start"], out["end"] = self.start.to_dict(), self.end.to_dict()
        out["delta"] = self.delta.to_dict()
        out["oom"] = None if self.oom is None else self.oom.to_dict()
        return out


def source_hash(source: str) -> str:
    """Return a short stable hash of a cell's source (whitespace at the ends ignored)."""
    return hashlib.blake2b(source.strip().encode(), digest_size=8).hexdigest()


def rusage_peak(start: MemorySnapshot, end: MemorySnapshot) -> int:
    """Return the process's peak RSS if it reached a new all-time high during the cell, else 0."""
    before, after = start.ram.peak_rss_bytes, end.ram.peak_rss_bytes
    return after if before is not None and after is not None and after > before else 0
