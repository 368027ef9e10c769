"""The figures of an out-of-memory error, and what a cell's record carries of it (JSON-able).

``read_figures`` takes the failed device's allocator from readings already made (the kernel's
snapshot); ``figures_now`` reads them afresh, for an isolated child at the moment it fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kerasmagic.oom.detect import OomError
from kerasmagic.oom.limits import device_limit, is_cpu, reported_limit, same_device

if TYPE_CHECKING:
    from kerasmagic.backends import BackendInfo
    from kerasmagic.probes.nvml_types import GpuDevice


@dataclass(frozen=True)
class Figures:
    """The failed device's allocator: bytes in use, peak and limit (None: not known)."""

    device: str | None
    in_use_bytes: int | None = None
    peak_bytes: int | None = None
    limit_bytes: int | None = None
    limit_source: str | None = None  # where the limit comes from, in words
    rss_bytes: int | None = None  # the process's RAM, where no allocator keeps figures

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Figures:
        """Rebuild from ``to_dict`` output, ignoring fields this version does not know."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass(frozen=True)
class OomFacts:
    """An out-of-memory error as a cell's record carries it (docs/protocol.md, ``oom``)."""

    backend: str
    device: str | None
    wanted_bytes: int | None
    shape: tuple[int, ...] | None
    dtype: str | None
    in_use_bytes: int | None
    peak_bytes: int | None
    limit_bytes: int | None
    limit_source: str | None
    remedy: str
    isolated: bool = False  # raised in a %%fresh_model --isolate child, now gone

    @classmethod
    def of(cls, oom: OomError, figures: Figures, remedy: str, isolated: bool) -> OomFacts:
        """Return the facts of ``oom`` with the device's ``figures``."""
        return cls(
            oom.backend, figures.device or oom.device, oom.wanted_bytes, oom.shape, oom.dtype,
            figures.in_use_bytes, figures.peak_bytes, figures.limit_bytes, figures.limit_source,
            remedy, isolated,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict that ``json.dumps`` accepts (the shape as a list)."""
        out = asdict(self)
        out["shape"] = None if self.shape is None else list(self.shape)
        return out


def read_figures(
    oom: OomError,
    backends: Sequence[BackendInfo],
    gpus: Sequence[GpuDevice],
    host_total: int | None = None,
    rss: int | None = None,
) -> Figures:
    """Return the failed device's figures from readings already made.

    The message's own figures (PyTorch's CUDA message gives them at the failure) win over the
    reading; a device the message does not name (JAX's) is the backend's first.
    """
    device, in_use, peak = oom.device, None, None
    for info in backends:
        for d in info.devices if info.name == oom.backend else ():
            if device is None or same_device(d.name, device):
                device, in_use, peak = d.name, d.in_use_bytes, d.peak_bytes
                break
    reported = oom.limit_bytes or reported_limit(backends, oom.backend, device)
    limit = device_limit(oom.backend, device, gpus, reported, host_total)
    source = "the error message" if oom.limit_bytes else (limit.source if limit else None)
    return Figures(
        device,
        oom.in_use_bytes if oom.in_use_bytes is not None else in_use,
        peak,
        limit.bytes if limit else None,
        source,
        rss if in_use is None and oom.in_use_bytes is None else None,
    )


def figures_now(oom: OomError) -> Figures:
    """Return the failed device's figures read now (an isolated child, as it fails)."""
    import psutil

    from kerasmagic.backends import read_active
    from kerasmagic.probes import read_gpus

    on_gpu = oom.device is not None and not is_cpu(oom.device)
    gpus = read_gpus().devices if on_gpu and oom.backend == "tensorflow" else ()
    rss = int(psutil.Process().memory_info().rss)
    return read_figures(oom, read_active(), gpus, int(psutil.virtual_memory().total), rss)
