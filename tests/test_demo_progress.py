"""``kerasmagic demo``'s progress line keeps each variant's label whole on an 80-column terminal."""

from __future__ import annotations

import io
import re

import pytest

from kerasmagic._demo import VARIANTS, StepProgress

LABELS = [f"[{i}/{len(VARIANTS)}] {label}" for i, label in enumerate(VARIANTS.values(), start=1)]


@pytest.mark.parametrize("label", LABELS)
@pytest.mark.parametrize("done", [0, 1, 12, 30])
def test_each_label_is_shown_whole_at_80_columns(label: str, done: int) -> None:
    progress = StepProgress(io.StringIO(), label, 30)
    progress.update(done)
    progress._start -= 3600  # an hour in: the clock and the estimate take their widest form
    line = progress.line(80)
    assert len(line) <= 79, line
    assert line.startswith(f"{label}  "), line  # whole, not "[2/3] del + keras clea..."
    counts = re.search(r"(\d+)/30", line)
    assert (counts is not None and counts.group(1) == str(done)) or done == 0, line


def test_a_short_label_keeps_the_full_bar_and_a_long_one_a_shorter_status() -> None:
    short = StepProgress(io.StringIO(), "[1/3] none", 30)
    short.update(15)
    assert "[##########..........] 15/30 models" in short.line(80)
    long = StepProgress(io.StringIO(), LABELS[1], 30)
    long.update(15)
    assert long.line(80).startswith(LABELS[1]) and "15/30" in long.line(80)


def test_only_a_label_too_long_for_the_terminal_is_cut() -> None:
    progress = StepProgress(io.StringIO(), "[1/3] " + "x" * 100, 30)
    progress.update(3)
    line = progress.line(80)
    assert len(line) <= 79 and "...  [##" in line and "3/30 models" in line, line


def test_the_kerasmagic_variant_names_the_call_it_makes() -> None:
    """The loop calls kerasmagic.reset() before each model (what %%fresh_model runs)."""
    assert VARIANTS["kerasmagic"] == "with kerasmagic.reset() (as %%fresh_model)"
