"""TensorFlow's execution mode on the main thread, and putting it back after an interrupt.

TensorFlow switches a thread to graph mode for the length of a ``with`` block (tracing a
``tf.function``: Keras's ``fit`` traces its train step on the first call): ``Context._mode``
sets the thread's ``is_eager`` and only its ``finally`` sets it back. A Ctrl-C that lands in
that ``finally`` before the line that undoes the switch leaves the thread in graph mode for
good: every later ``fit`` fails with "`tf.data.Dataset` only supports Python-style iteration in
eager mode", until a restart. (One that lands elsewhere in the block leaves the generator
suspended, holding the switch, and it undoes it when the stored traceback goes.)

TensorFlow also keeps a stack of context switches per thread (``init_scope`` reads it to find
the outermost context). ``Graph.as_default`` and ``Context._mode`` push an entry before their
``try`` and pop it in their ``finally``: a Ctrl-C that lands before the ``try`` or in the
``finally`` before the ``pop`` ends the block and leaves its entry on the stack for good.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from kerasmagic.backends.tensorflow.alloc import tf_context

log = logging.getLogger(__name__)


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


AT_START = Mode(True, 1, 0)  # a thread's state when TensorFlow is first imported


def drop_stale_switches(before: Mode | None) -> int:
    """Pop the context switches left above ``before`` by blocks that are over; return how many.

    An entry stays while its block is open: a graph's while that graph is on the default-graph
    stack and the thread is in graph mode; an eager one (``init_scope`` in a graph) while a
    graph entered since ``before`` is still open. Anything above the last such entry is left by
    an interrupted entry or exit.
    """
    try:
        return _drop_stale_switches(before)
    except Exception:  # TF's private stacks renamed: a warning once, never a per-cell error
        if not _failed:
            _failed.append(True)
            log.warning("kerasmagic: could not read TensorFlow's context switches", exc_info=True)
        return 0


_failed: list[bool] = []


def _drop_stale_switches(before: Mode | None) -> int:
    ctx, ops = tf_context(), sys.modules.get("tensorflow.python.framework.ops")
    if ctx is None or ops is None:
        return 0
    start = before or AT_START
    stack = ctx.context_switches.stack
    if len(stack) <= max(1, start.switches):  # the cell's end, nearly always: nothing to read
        return 0
    graphs = list(getattr(getattr(ops, "_default_graph_stack", None), "stack", ()))
    opened = graphs[start.graphs :]
    dropped = 0
    while len(stack) > max(1, start.switches):
        graph = getattr(stack[-1].enter_context_fn, "__self__", None)
        if graph is not None:
            still_open = any(g is graph for g in opened) and not ctx.executing_eagerly()
        else:
            still_open = bool(opened)
        if still_open:
            break
        stack.pop()
        dropped += 1
    return dropped


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
