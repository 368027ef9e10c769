"""What holds memory, on demand: every live Keras model with its holders, and the largest data.

The sidebar's "Scan" and ``%gpu_mem --deep`` read the same two lists. Walking ``gc`` takes
tens to hundreds of ms, so this runs only when asked, on the main thread, between cells.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kerasmagic.cleanup.holders import LiveModel, live_models
from kerasmagic.probes.variables import Variable, largest_variables


@dataclass(frozen=True)
class DeepScan:
    """Live models (with holders, remedies, and whether "Free memory" frees them), largest data."""

    models: tuple[LiveModel, ...]
    variables: tuple[Variable, ...]

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"models": [...], "variables": [...]}``, JSON-able (tuples become lists)."""
        return {
            "models": [_plain(m) for m in self.models],
            "variables": [_plain(v) for v in self.variables],
        }


def _plain(item: LiveModel | Variable) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(item).items()}


def deep_scan(namespace: Mapping[str, Any]) -> DeepScan:
    """Return every live model and the largest user variables (read-only: nothing is freed)."""
    return DeepScan(tuple(live_models(namespace)), tuple(largest_variables(namespace)))
