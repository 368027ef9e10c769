"""The demo's K-fold story, for real: TensorFlow's allocator capped at 160 MB as a GPU's memory
is, ten folds in one loop, each way in its own process (an IPython shell)."""

from __future__ import annotations

import pytest

from kerasmagic._demo import FOLDS
from kerasmagic._demo import run_folds_process as run_variant_process

MB = 2**20


@pytest.mark.slow
def test_a_plain_loop_under_fresh_model_runs_every_fold_flat_where_hand_cleanup_runs_out() -> None:
    hand, ours = run_variant_process("hand"), run_variant_process("kerasmagic")
    assert hand.folds < FOLDS and hand.error is not None, hand  # each fold's model stays
    assert "ran out of memory at fold" in hand.words()
    assert ours.folds == FOLDS and ours.error is None, ours
    one_fold = ours.in_use_bytes[0]
    assert max(ours.in_use_bytes[3:]) <= max(ours.in_use_bytes[:3]) + one_fold / 2, ours
    assert ours.words().startswith(f"ran all {FOLDS} folds, the allocator flat at")
