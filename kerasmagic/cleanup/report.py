"""``CleanupReport``: what one cleanup dropped and freed, and which models are still alive."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MB = 1024 * 1024


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
        freed = f"freed {self.freed_bytes / MB:.1f} MB of RAM"
        if self.tf_freed_bytes:  # None: no allocator statistics; 0: nothing to say
            freed += f" and {self.tf_freed_bytes / MB:.1f} MB of TensorFlow tensors"
        parts = [f"{freed} in {self.elapsed_s:.2f} s"]
        parts.append(f"dropped {_names(self.dropped)}")
        parts += self.released
        if self.kept:
            parts.append(f"still alive: {_names(self.kept)}")
        if self.not_freed:
            parts.append(f"NOT freed: {_names(self.not_freed)}")
        return "; ".join(parts + list(self.notes))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict (for the sidebar and logs)."""
        return dataclasses.asdict(self)


def _names(items: tuple[str, ...], limit: int = 6) -> str:
    if not items:
        return "nothing"
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
