"""Figures in words: bytes as ``1.2 GB``, ``-3.5 MB``; lines wrapped as text."""

from __future__ import annotations

import textwrap

WIDTH = 80  # columns: a notebook's output is wider than this, with its prompt and sidebars


def fmt_bytes(n: int | None) -> str:
    """Return ``n`` bytes as a short human figure (``1.2 GB``); ``n/a`` for None."""
    if n is None:
        return "n/a"
    sign, value = ("-" if n < 0 else ""), float(abs(n))
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024:
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    return f"{sign}{value:.1f} TB"


def signed_bytes(n: int | None) -> str:
    """Return a change in bytes with its sign (``+1.2 MB``, ``-3.0 KB``, and ``0 B`` as the
    sidebar's ``formatDelta`` writes it); ``n/a`` for None."""
    return "n/a" if n is None else ("+" if n > 0 else "") + fmt_bytes(n)


def reserved_text(reserved: int) -> str:
    """Name NVML's reservation beside what runs out (``kerasmagic/snapshot.py``'s headline)."""
    return f"{fmt_bytes(reserved)} reserved on the GPU (NVML)"


def fill(text: str) -> str:
    """Wrap ``text`` at spaces within ``WIDTH`` columns, later lines indented: a notebook's
    own wrapping breaks inside words."""
    return textwrap.fill(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
