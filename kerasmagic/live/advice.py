"""What to tell a user whose cell keeps growing something: the cause, and the remedy that fits.

Advice depends on how the cell ran: a plain cell is told to use ``%%fresh_model``; a cell that
already runs under it is told what ``%%fresh_model`` cannot free and what to change instead.
"""

from __future__ import annotations

PLAIN = "plain"
FRESH = "fresh"
ISOLATED = "isolate"

FRESH_REMEDY = (
    "Run the cell under %%fresh_model (frees stale models, TF's gradient registry and Keras "
    "names first), or %%fresh_model --isolate to train in a fresh process."
)

# what -> advice for a cell that already runs under %%fresh_model
UNDER_FRESH = {
    "graph_ops": (
        "The cell adds ops to TensorFlow's default graph on every run (TF1 graph mode): create "
        "the ops once in an earlier cell and feed new values (placeholders, feed_dict), or "
        "call tf.compat.v1.reset_default_graph() before rebuilding them."
    ),
    "functions": (
        "A tf.function that outlives the cell traces again on every run: one defined in an "
        "earlier cell and called with each new model, or one called with Python numbers "
        "(each new value is a new trace). Pass tensors, or define the function inside the "
        "cell; fn.experimental_get_tracing_count() shows its traces."
    ),
    "custom_gradients": (
        "A tf.function from an earlier cell keeps every traced training step (and its "
        "custom-gradient entries) alive: define the training step inside the cell, or "
        "reuse one model and optimizer with it."
    ),
    "live_models": (
        "Each run keeps one more model alive through a name the cell does not rebind or a "
        "structure it appends to: %gpu_mem --deep shows what holds them; use "
        "%%fresh_model --keep/--all, or store weights or metrics instead of models."
    ),
    "name_counter": (
        "Keras's name counter still grows: layers are created outside the cleaned cell "
        "(in a function from an earlier cell run on another thread, or after a reset)."
    ),
    "memory": (
        "%%fresh_model already frees stale models, so something else keeps this memory: data "
        "the cell appends to on every run (%gpu_mem --deep lists the largest holders), or "
        "native memory that only a process exit returns: %%fresh_model --isolate."
    ),
}

UNDER_ISOLATE = (
    "The cell runs isolated, so the growth is in what it brings back into the kernel "
    "(--outputs) or in data the kernel keeps: bring back weights or metrics, not arrays."
)

SLOWDOWN = " Each op added makes later session calls slower"


def remedy(what: str, mode: str) -> str:
    """Return the advice for growth of ``what`` in a cell that ran in ``mode``."""
    if mode == ISOLATED:
        return UNDER_ISOLATE
    if mode != FRESH:
        return FRESH_REMEDY
    return UNDER_FRESH.get(what, UNDER_FRESH["memory"])


def cell_mode(source: str) -> str:
    """Return how a cell runs: under ``%%fresh_model`` (with or without ``--isolate``) or plain."""
    first = source.lstrip().split("\n", 1)[0]
    if not first.startswith("%%fresh_model"):
        return PLAIN
    return ISOLATED if "--isolate" in first.split() else FRESH


def slowdown(durations_s: list[float]) -> str:
    """Return " (runs took 0.21 s → 0.35 s)" when the runs got steadily slower, else ""."""
    if len(durations_s) < 2 or durations_s[-1] < 1.2 * durations_s[0]:
        return ""
    return f" (its runs took {durations_s[0]:.2f} s → {durations_s[-1]:.2f} s)"
