"""Inline HTML/SVG pieces for the live widget: a labelled bar and a sparkline (no JavaScript)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from kerasmagic.units import fmt_bytes

WIDTH, HEIGHT = 300, 40
# JupyterLab theme variables, so light, dark and high-contrast themes work; the fallbacks serve
# frontends without them.
BRAND = "var(--jp-brand-color1, #1976d2)"
WARN = "var(--jp-warn-color1, #f57c00)"
ERROR = "var(--jp-error-color1, #d32f2f)"
TRACK = "var(--jp-layout-color3, #bdbdbd)"


def bar_html(label: str, used: int, total: int, note: str = "") -> str:
    """Return a horizontal bar of ``used`` out of ``total`` with both figures and a note."""
    share = min(1.0, max(0.0, used / total)) if total > 0 else 0.0
    colour = ERROR if share > 0.9 else WARN if share > 0.7 else BRAND
    return (
        "<div style='display:flex;flex-wrap:wrap;align-items:center;gap:8px;font-family:monospace'>"
        f"<span style='width:4em'>{html.escape(label)}</span>"
        f"<span style='width:{WIDTH}px;height:12px;background:{TRACK};display:inline-block'>"
        f"<span style='width:{share * 100:.1f}%;height:12px;background:{colour};"
        "display:block'></span></span>"
        f"<span>{fmt_bytes(used)} / {fmt_bytes(total)} ({share:.0%})"
        f"{' &middot; ' + html.escape(note) if note else ''}</span></div>"
    )


def sparkline_points(values: Sequence[int], width: int = WIDTH, height: int = HEIGHT) -> str:
    """Return SVG polyline points scaling ``values`` into a ``width`` x ``height`` box."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1
    step, scale = width / max(1, len(values) - 1), (height - 4) / span
    return " ".join(
        f"{i * step:.1f},{height - 2 - (v - low) * scale:.1f}" for i, v in enumerate(values)
    )


def sparkline_svg(values: Sequence[int], title: str) -> str:
    """Return an inline SVG sparkline of byte values with its min and max as text."""
    if not values:
        return ""
    points = sparkline_points(values)
    caption = (
        f"{html.escape(title)} (last {len(values)}): "
        f"{fmt_bytes(min(values))} .. {fmt_bytes(max(values))}"
    )
    return (
        f"<div style='font-family:monospace'>{caption}<br>"
        f"<svg width='{WIDTH}' height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}' "
        "xmlns='http://www.w3.org/2000/svg'>"
        f"<polyline fill='none' style='stroke:{BRAND}' stroke-width='1.5' points='{points}'/>"
        "</svg></div>"
    )
