"""kerasmagic's text wraps between words where people read it (issue 39, item 4).

JupyterLab and classic Notebook (Colab's users) draw printed output in a ``<pre>`` that breaks
a line anywhere (``word-break: break-all``): "for t|he whole cell", "TF's gr|adient". The
``%%fresh_model`` report line is HTML that wraps between words in any frontend, and the
figure it leads with is its cell badge's; ``report.summary()`` printed by the user keeps its
lines short enough that none needs to wrap.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from .conftest import Server, run_cell, wait_for_kernel, write_notebook
from .test_classic_widget import classic, run_classic  # noqa: F401 (classic: a fixture)
from .test_first_hour import BADGE, LINES_JS, SPLIT_WORDS_JS

pytestmark = pytest.mark.slow

MODEL = (
    "%%fresh_model\nmodel = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])\n"
    "model.compile('adam', 'mse')\nhistory = model.fit(np.ones((8, 8)), np.ones((8, 2)), verbose=0)"
)
CELLS = [
    "%load_ext kerasmagic\nimport keras, numpy as np\nbase = keras.Sequential([keras.Input((8,))])",
    MODEL,
    MODEL,  # drops the first cell's model, releases its training graph, keeps base
    "from kerasmagic.cleanup import last_report\nprint(last_report().summary())",
]
LINE = ".kerasmagic-line summary"
# Lines of a <pre>'s text that the page drew over more than one line box.
WRAPPED_JS = """(pre) => { const out = [];
  const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    let at = 0;
    for (const line of n.textContent.split('\\n')) {
      const r = document.createRange(); r.setStart(n, at); r.setEnd(n, at + line.length);
      const tops = new Set([...r.getClientRects()].filter(x => x.width > 0)
        .map(x => Math.round(x.top)));
      if (tops.size > 1) out.push(line);
      at += line.length + 1;
    }
  }
  return out; }"""


SET_WIDTH_JS = "(el, w) => { el.parentElement.style.width = `${w}px`; }"


def wraps_between_words(line: Any) -> None:
    """Where ``line`` must wrap, no word of it is split over two lines.

    The box the line is in is sized from the line's own one-line width, so the line wraps
    whatever the fonts and the frontend's responsive layout at a window width make of it.
    """
    assert line.evaluate("el => getComputedStyle(el).wordBreak") == "normal"
    one_line = line.evaluate(
        "el => { el.parentElement.style.width = 'max-content';"
        " return el.getBoundingClientRect().width; }"
    )
    assert line.evaluate(LINES_JS) == 1 and one_line > 200, one_line
    for fraction in (0.4, 0.6, 0.8):
        line.evaluate(SET_WIDTH_JS, one_line * fraction)
        assert line.evaluate(LINES_JS) >= 2, f"the line must wrap at {fraction:.0%} of its width"
        assert line.evaluate(SPLIT_WORDS_JS) == [], (fraction, line.inner_text())
    line.evaluate("el => { el.parentElement.style.width = ''; }")


def test_the_report_line_and_summary_wrap_between_words_in_jupyterlab(
    lab: Server, page: Any
) -> None:
    write_notebook(lab.root, "wrapping.ipynb", CELLS)
    page.goto(f"{lab.url}/lab/workspaces/wrapping/tree/wrapping.ipynb")
    wait_for_kernel(page)
    for index in range(len(CELLS)):
        run_cell(page, index, timeout_s=120)
    # The summary's lines fit the notebook at this width: none is left to the frontend to break.
    printed = page.locator(".jp-Notebook .jp-Cell").nth(3).locator(".jp-OutputArea-output pre")
    assert "dropped model" in printed.inner_text() and "still alive: base" in printed.inner_text()
    assert printed.evaluate(WRAPPED_JS) == []
    assert printed.evaluate(SPLIT_WORDS_JS) == []

    cell = page.locator(".jp-Notebook .jp-Cell").nth(2)
    line = cell.locator(LINE)
    assert line.inner_text().startswith("kerasmagic: RSS ")
    badge = cell.locator(BADGE)
    badge.wait_for(state="visible", timeout=15000)
    figure = re.match(r"RSS \S+ \w+", badge.inner_text())
    assert figure is not None and line.inner_text().startswith(f"kerasmagic: {figure[0]} ")

    # The report line wraps at any width, between words; its detail is one click away.
    wraps_between_words(line)
    detail = cell.locator(".kerasmagic-line")
    assert "freed" not in detail.inner_text()  # closed: the line alone
    line.click()
    assert re.search(r"\nfreed .* in [\d.]+ s\ndropped model, history.model\n", detail.inner_text())
    assert detail.evaluate(SPLIT_WORDS_JS) == [], detail.inner_text()


def test_the_report_line_wraps_between_words_in_classic_notebook(
    classic: Server,  # noqa: F811
    page: Any,
) -> None:
    """Notebook 6.5.7, as Colab's users see kerasmagic: its stylesheet breaks every printed
    line anywhere (Bootstrap's ``pre { word-break: break-all }``)."""
    write_notebook(classic.root, "wrapping.ipynb", CELLS)
    page.goto(f"{classic.url}/notebooks/wrapping.ipynb")
    page.wait_for_function("() => window.Jupyter?.notebook?.kernel?.is_connected()")
    page.wait_for_function("() => window.Jupyter.notebook.kernel_busy === false")
    for index in range(len(CELLS)):
        run_classic(page, index)
    line = page.locator("#notebook-container .cell").nth(2).locator(LINE)
    assert line.inner_text().startswith("kerasmagic: RSS ")
    wraps_between_words(line)
    printed = page.locator("#notebook-container .cell").nth(3).locator(".output_area pre")
    assert "dropped model" in printed.inner_text()
