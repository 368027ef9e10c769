"""WCAG 2 text contrast of what the page shows, computed in the browser from computed styles.

``CONTRAST_JS`` takes a list of CSS selectors and returns one row per visible piece of text
inside them (an element with its own text, SVG ``<text>`` included): the text, its colour
(``fill`` for SVG), the effective background (every ancestor's background colour composited
from the page's bottom up, with opacity) and the contrast ratio. Disabled controls are left
out, as WCAG 1.4.3 exempts inactive components.
"""

from __future__ import annotations

from typing import Any

CONTRAST_JS = """(selectors) => {
  const parse = (c) => {
    const m = c.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, bottom) => {  // top composited over an opaque bottom
    const a = top[3];
    return [0, 1, 2].map(i => top[i] * a + bottom[i] * (1 - a)).concat([1]);
  };
  const background = (el) => {
    const chain = [];
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) chain.push(e);
    let bg = [255, 255, 255, 1];
    for (const e of chain.reverse()) {
      const c = parse(getComputedStyle(e).backgroundColor);
      const o = Number(getComputedStyle(e).opacity);
      if (c && c[3] > 0) bg = over([c[0], c[1], c[2], c[3] * o], bg);
    }
    return bg;
  };
  const lum = (c) => {
    const [r, g, b] = c.slice(0, 3).map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const rows = [];
  for (const sel of selectors) {
    for (const root of document.querySelectorAll(sel)) {
      for (const el of [root, ...root.querySelectorAll('*')]) {
        const own = [...el.childNodes].filter(n => n.nodeType === 3)
          .map(n => n.textContent.trim()).join(' ').trim();
        if (!own || el.closest('button:disabled, [aria-hidden="true"] title, title')) continue;
        const rect = el.getBoundingClientRect();
        const style = getComputedStyle(el);
        if (!rect.width || !rect.height || style.visibility === 'hidden') continue;
        const svgText = el instanceof SVGElement;
        const fg = parse(svgText ? style.fill : style.color);
        if (!fg) continue;
        let alpha = fg[3];
        for (let e = el; e; e = e.parentElement) alpha *= Number(getComputedStyle(e).opacity);
        const bg = background(svgText ? el.ownerSVGElement : el);
        const text = over([fg[0], fg[1], fg[2], alpha], bg);
        const [a, b] = [lum(text), lum(bg)].sort((x, y) => y - x);
        rows.push({ selector: sel, text: own.slice(0, 60), tag: el.tagName,
          cls: String(el.className?.baseVal ?? el.className), fg: style.color,
          bg: 'rgb(' + bg.slice(0, 3).map(Math.round).join(',') + ')',
          ratio: Math.round(((a + 0.05) / (b + 0.05)) * 100) / 100 });
      }
    }
  }
  return rows;
}"""

THEME_JS = """(light) => document.body.dataset.jpThemeLight === String(light)
  && getComputedStyle(document.body).getPropertyValue('--jp-layout-color1').trim() !== ''"""


def set_theme(page: Any, name: str) -> None:
    """Switch JupyterLab's theme with its own command and wait until it applies."""
    page.evaluate(
        "(t) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", name
    )
    page.wait_for_function(THEME_JS, arg="Light" in name, timeout=30000, polling=200)
    page.wait_for_timeout(500)  # the theme's stylesheet lands after the attribute


def low_contrast(page: Any, selectors: list[str], minimum: float = 4.5) -> list[Any]:
    """Return the text rows under ``selectors`` below ``minimum``; fail if there was no text."""
    rows = page.evaluate(CONTRAST_JS, selectors)
    for sel in selectors:
        assert any(r["selector"] == sel for r in rows), f"no visible text under {sel}"
    return [r for r in rows if r["ratio"] < minimum]
