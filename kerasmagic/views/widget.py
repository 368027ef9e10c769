"""The ipywidgets view of the live monitor: bars, figures, a sparkline and the leak warning.

One HTML widget (no custom JavaScript), so it renders in JupyterLab, Notebook 7 and VS Code,
and a cell's update is one comm message. The figures shown are also synced traits of
``LiveWidget``. Fed by ``LiveMonitor.subscribe``; it collects nothing itself.
"""

from __future__ import annotations

import html
import logging
import threading
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets
from traitlets import Bool, Dict, Int, List, Unicode

from kerasmagic.backends import LABELS, BackendInfo
from kerasmagic.compat.registry import works
from kerasmagic.live import CellRecord, LeakVerdict, LiveMonitor
from kerasmagic.snapshot import MemorySnapshot
from kerasmagic.units import fmt_bytes, reserved_text, signed_bytes

log = logging.getLogger(__name__)
SPARK_CELLS = 50
SPARK_MIN_SPAN = 4 * 2**20  # the sparkline's height stands for at least 4 MB: no noise drawn tall
PARTS = ("bars", "figures", "spark", "alert")  # each a div of class kerasmagic-<part>
WIDTH, HEIGHT = 300, 40
# JupyterLab's theme variables (light, dark, high contrast); the fallbacks serve other frontends.
OK_COLOUR = "var(--jp-success-color1, #2e7d32)"  # a mark only: as text it reads 4.1:1 on white
WARN_COLOUR, ERROR = "var(--jp-error-color1, #b71c1c)", "var(--jp-error-color1, #d32f2f)"
BRAND, WARN = "var(--jp-brand-color1, #1976d2)", "var(--jp-warn-color1, #f57c00)"
TRACK = "var(--jp-layout-color3, #bdbdbd)"


def bar_html(key: str, label: str, used: int, total: int, note: str = "") -> str:
    """Return a horizontal bar of ``used`` out of ``total`` with both figures and a note, in a
    div whose ``data-km-live`` and ``data-bytes`` let a page or test read it."""
    share = min(1.0, max(0.0, used / total)) if total > 0 else 0.0
    colour = ERROR if share > 0.9 else WARN if share > 0.7 else BRAND
    return (
        f"<div class='kerasmagic-{key}' data-km-live='{key}' data-bytes='{used}'>"
        "<div style='display:flex;flex-wrap:wrap;align-items:center;gap:8px;font-family:monospace'>"
        f"<span style='width:4em'>{html.escape(label)}</span>"
        f"<span style='width:{WIDTH}px;height:12px;background:{TRACK};display:inline-block'>"
        f"<span style='width:{share * 100:.1f}%;height:12px;background:{colour};"
        "display:block'></span></span>"
        f"<span>{fmt_bytes(used)} / {fmt_bytes(total)} ({share:.0%})"
        f"{' &middot; ' + html.escape(note) if note else ''}</span></div></div>"
    )


def sparkline_svg(values: Sequence[int], title: str) -> str:
    """Return an inline SVG sparkline of byte values with its min and max as text: a change
    under ``SPARK_MIN_SPAN`` is drawn in proportion, and one value is a flat line."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = max(high - low, SPARK_MIN_SPAN)
    base, scale = (low + high - span) / 2, (HEIGHT - 4) / span
    heights = [HEIGHT - 2 - (v - base) * scale for v in values] * (2 if len(values) == 1 else 1)
    step = WIDTH / (len(heights) - 1)
    points = " ".join(f"{i * step:.1f},{y:.1f}" for i, y in enumerate(heights))
    cells = f"last {len(values)} cells" if len(values) > 1 else "1 cell so far"
    lo, hi = fmt_bytes(low), fmt_bytes(high)
    return (
        f"<div style='font-family:monospace'>{html.escape(title)} ({cells}): "
        f"{lo if lo == hi else f'{lo} .. {hi}'}<br>"
        f"<svg width='{WIDTH}' height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}' "
        "xmlns='http://www.w3.org/2000/svg'>"
        f"<polyline fill='none' style='stroke:{BRAND}' stroke-width='1.5' points='{points}'/>"
        "</svg></div>"
    )


def _allocator_totals(snap: MemorySnapshot) -> tuple[int | None, int | None]:
    """Return the Keras backend's tensors in use (on its GPUs, else on the CPU) and the VRAM
    the process holds (none to compare with for the CPU alone)."""
    if (info := snap.backend) is None or not info.devices:
        return None, None
    gpus = [d.in_use_bytes or 0 for d in info.devices if d.kind != "cpu"]
    return (sum(gpus), snap.gpu_used_bytes) if gpus else (info.in_use_bytes, None)


def _backend_figures(info: BackendInfo) -> str:
    """Return the Keras backend's figures in words (JAX, PyTorch: no TF rows)."""
    parts = [f"{info.name} {info.version or ''}".strip() + f" ({info.platform or 'not started'})"]
    if info.in_use_bytes is not None:
        parts.append(f"in use {fmt_bytes(info.in_use_bytes)}")
    return ", ".join(parts + [f"{key.replace('_', ' ')} {n}" for key, n in info.caches.items()])


class LiveWidget(widgets.HTML):  # type: ignore[misc]
    """Memory of this kernel, updated after every cell and while a cell runs."""

    rss_bytes = Int(0).tag(sync=True)
    host_total_bytes = Int(0).tag(sync=True)
    cell_peak_rss_bytes = Int(0).tag(sync=True)  # peak of the last finished cell
    running_peak_rss_bytes = Int(0).tag(sync=True)  # highest sample since that cell ended
    gpu_used_bytes = Int(None, allow_none=True).tag(sync=True)
    gpu_total_bytes = Int(None, allow_none=True).tag(sync=True)
    allocator_in_use_bytes = Int(None, allow_none=True).tag(sync=True)  # the Keras backend's
    allocator_reserved_bytes = Int(None, allow_none=True).tag(sync=True)
    caches = Dict().tag(sync=True)  # the Keras backend's cache sizes, by name
    live_models = Int(None, allow_none=True).tag(sync=True)
    name_counter = Int(None, allow_none=True).tag(sync=True)
    last_cell = Int(None, allow_none=True).tag(sync=True)
    last_delta_bytes = Int(None, allow_none=True).tag(sync=True)
    history_rss: List[int] = List().tag(sync=True)  # ints; no per-item trait: 50 checks a cell
    samples_seen = Int(0).tag(sync=True)
    growing = Bool(False).tag(sync=True)
    warning = Unicode("").tag(sync=True)
    backend = Unicode("").tag(sync=True)  # what Keras runs on: tensorflow, jax, torch
    backend_figures = Unicode("").tag(sync=True)  # its allocator and caches, in words

    def __init__(self, monitor: LiveMonitor, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_class("kerasmagic-live")
        self._lock = threading.RLock()  # show_cell shows its end snapshot within its own hold
        self._parts = dict.fromkeys(PARTS, "")  # the HTML of each part, in display order
        with self.hold_sync():
            for record in monitor.history()[-SPARK_CELLS:]:
                self.show_cell(record, monitor.verdict())
            if (latest := monitor.latest()) is not None:
                self.show_snapshot(latest)
        self._monitor = monitor
        self._unsubscribe = monitor.subscribe(self._on_event)

    def part(self, name: str) -> str:
        """Return the HTML of one part of the view (one of ``PARTS``)."""
        return self._parts[name]

    def _handle_msg(self, msg: dict[str, Any]) -> None:
        """A frontend's message: a state request is answered and a valid update taken; anything
        else is dropped (ipywidgets' own handler prints a traceback into the running cell for a
        malformed message). Through ipywidgets' own where the registry finds it moved."""
        if not works("ipywidgets.handle_msg"):  # moved (said once, by compat): theirs
            super()._handle_msg(msg)
            return
        try:
            data = msg["content"]["data"]
            state, method = data.get("state"), data.get("method")
            if method == "request_state":
                self.send_state()  # buffer_paths: binary; JupyterLab sends [] with every update
            elif method == "update" and isinstance(state, dict) and not data.get("buffer_paths"):
                self.set_state(state)
        except Exception:
            log.debug("kerasmagic widget: dropped a frontend message", exc_info=True)

    def _on_event(self, kind: str, payload: Any) -> None:
        if kind == "sample":
            self.show_snapshot(payload)
        elif kind == "cell":
            self.show_cell(payload, self._monitor.verdict())

    def close(self) -> None:
        """Stop listening to the monitor and close this widget and its own Layout and Style
        widgets (``close()`` leaves their comms open)."""
        self._unsubscribe()
        for part in (getattr(self, "layout", None), getattr(self, "style", None)):
            if isinstance(part, widgets.Widget):
                part.close()
        super().close()

    def show_snapshot(self, snap: MemorySnapshot) -> None:
        """Show the memory figures of one snapshot (a sample or a cell's end)."""
        info, devices = snap.backend, snap.gpu.devices
        in_use, reserved = _allocator_totals(snap)
        with self._lock, self.hold_sync():  # one comm message for all traits and the HTML
            self._assign(
                samples_seen=self.samples_seen + 1,
                rss_bytes=snap.ram.rss_bytes,
                host_total_bytes=snap.ram.total_bytes,
                running_peak_rss_bytes=max(self.running_peak_rss_bytes, snap.ram.rss_bytes),
                gpu_used_bytes=snap.gpu_used_bytes,
                gpu_total_bytes=sum(d.total_bytes for d in devices) if devices else None,
                allocator_in_use_bytes=in_use,
                allocator_reserved_bytes=reserved,
                backend=info.name if info is not None else snap.keras_backend or "",
                backend_figures=_backend_figures(info) if info is not None else "",
                caches=dict(info.caches) if info is not None else {},
                live_models=snap.keras.live_models,
                name_counter=snap.keras.name_counter,
            )
            self._parts.update(bars=self._bars_html(snap), figures=self._figures_html())
            self.value = "".join(
                f"<div class='kerasmagic-{k}'>{v}</div>" for k, v in self._parts.items()
            )

    def show_cell(self, record: CellRecord, verdict: LeakVerdict) -> None:
        """Show a finished cell: its delta, the sparkline and the leak verdict."""
        with self._lock, self.hold_sync():
            history = [*self.history_rss, record.end.ram.rss_bytes][-SPARK_CELLS:]
            self._assign(
                cell_peak_rss_bytes=record.peak_rss_bytes,
                running_peak_rss_bytes=0,
                last_cell=record.execution_count,
                last_delta_bytes=record.delta.rss_bytes,
                history_rss=history,
                growing=verdict.growing,
                warning=verdict.message if verdict.growing else "",
            )
            self._parts["spark"] = sparkline_svg(history, "RSS after each cell")
            self._parts["alert"] = (
                f"<div role='alert' style='color:{WARN_COLOUR};font-weight:bold'>"
                f"&#9888; {html.escape(self.warning)}</div>"
                if self.growing
                else f"<div style='border-left:3px solid {OK_COLOUR};padding-left:4px'>"
                "stable: no growth across re-runs</div>"
            )
            self.show_snapshot(record.end)

    def _assign(self, **values: Any) -> None:
        """Set the traits whose value changed: setting one costs ~4 us even to the same value,
        and a cell sets ~20, most of them unchanged (the GPU, the backend, the warning)."""
        for name, value in values.items():
            if getattr(self, name) != value:
                setattr(self, name, value)

    def _bars_html(self, snap: MemorySnapshot) -> str:
        ram, lead, since = snap.ram, snap.headline, fmt_bytes(self.running_peak_rss_bytes)
        peaks = f"peak so far {since} (measuring the first cell…)"
        if self.last_cell is not None:
            peaks = f"peak: last cell {fmt_bytes(self.cell_peak_rss_bytes)}, since then {since}"
        rss = bar_html("rss", "RSS", ram.rss_bytes, ram.total_bytes, peaks)
        if lead.what == "allocator":  # what runs out leads; NVML's reservation is named beside
            nvml = "NVML n/a" if lead.reserved_bytes is None else reserved_text(lead.reserved_bytes)
            limit = lead.limit_bytes or max(lead.used_bytes, 1)
            return bar_html("lead", lead.label, lead.used_bytes, limit, nvml) + rss
        label = LABELS.get(self.backend or "tensorflow", self.backend)  # nothing yet: TF's rows
        in_use, used, total = self.allocator_in_use_bytes, self.gpu_used_bytes, self.gpu_total_bytes
        if used is not None and total:
            note, reserved = f"{label} allocator n/a", fmt_bytes(self.allocator_reserved_bytes)
            if in_use is not None:
                note = f"{label} in use {fmt_bytes(in_use)} of {reserved}"
            return rss + bar_html("vram", "VRAM", used, total, note)
        vram = f"<div>VRAM: {html.escape(snap.gpu.message or snap.gpu.status)}</div>"
        if in_use is None:
            return rss + vram
        missed = [d.uncounted for d in snap.backend.devices if d.uncounted] if snap.backend else []
        note = html.escape(f" ({missed[0]})") if missed else ""  # it misses small tensors: say so
        tag = f"class='kerasmagic-allocator' data-km-live='allocator' data-bytes='{in_use}'"
        tensors = f"<div>{html.escape(label)} tensors in use: {fmt_bytes(in_use)}{note}</div>"
        return f"{rss}{vram}<div {tag}>{tensors}</div>"

    def _figures_html(self) -> str:
        """The graph and Keras figures this snapshot has: one not read is left out, not shown
        as ``n/a`` (before TensorFlow or Keras is imported there is nothing to count)."""
        if self.backend in ("", "tensorflow"):
            graph = _known(
                (self.caches.get("functions"), "{} functions"),
                (self.caches.get("custom_gradients"), "{} custom gradients"),
            )
            graph = f"graph: {graph or 'TensorFlow not imported'}"
        else:
            graph = html.escape(self.backend_figures)
        models = _known(
            (self.live_models, "{} named in the notebook"), (self.name_counter, "name counter {}")
        )
        models = f"models: {models}" if models else "Keras not imported"
        delta = "measuring the first cell…"
        if self.last_cell is not None:
            delta = f"cell [{self.last_cell}] RSS {signed_bytes(self.last_delta_bytes)}"
        return f"<div>{graph} &middot; {models} &middot; last: {html.escape(delta)}</div>"


def _known(*figures: tuple[int | None, str]) -> str:
    """Join the figures that were read (``"3 live, name counter 12"``), skipping None."""
    return ", ".join(text.format(value) for value, text in figures if value is not None)
