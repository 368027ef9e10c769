"""TensorFlow's execution mode on the main thread, and putting it back after an interrupt.

TensorFlow switches a thread to graph mode for the length of a ``with`` block (tracing a
``tf.function``: Keras's ``fit`` traces its train step on the first call): ``Context._mode``
sets the thread's ``is_eager`` and only its ``finally`` sets it back. A Ctrl-C that lands in
that ``finally`` before the line that undoes the switch leaves the thread in graph mode for
good: every later ``fit`` fails with "`tf.data.Dataset` only supports Python-style iteration in
eager mode", until a restart. (One that lands elsewhere in the block leaves the generator
suspended, holding the switch, and it undoes it when the stored traceback goes.)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from kerasmagic.backends.tensorflow.alloc import tf_context


@dataclass(frozen=True)
class Mode:
    """The thread's execution mode and the depth of its two context stacks."""

    eager: bool
    switches: int  # TF's context switches (1 at a cell's top level: eager)
    graphs: int  # graphs entered as the default (0 at a cell's top level)


def read_mode() -> Mode | None:
    """Return this thread's mode, or None before TensorFlow is imported (never imports it)."""
    ctx = tf_context()
    ops = sys.modules.get("tensorflow.python.framework.ops")
    if ctx is None or ops is None:
        return None
    graphs = getattr(getattr(ops, "_default_graph_stack", None), "stack", ())
    return Mode(bool(ctx.executing_eagerly()), len(ctx.context_switches.stack), len(graphs))


def restore_eager(before: Mode) -> bool:
    """Switch the thread back to eager mode if it was eager ``before`` and is now in graph mode
    with no ``with`` block still open (both stacks as deep as before); True if it did."""
    now, ctx = read_mode(), tf_context()
    if now is None or ctx is None or not before.eager or now.eager:
        return False
    if (now.switches, now.graphs) != (before.switches, before.graphs):
        return False  # a suspended block holds the switch and undoes it when it is collected
    ctx._thread_local_data.is_eager = True  # what Context._mode's finally does
    return bool(ctx.executing_eagerly())
