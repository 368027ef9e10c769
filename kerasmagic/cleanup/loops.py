"""Loops need no cleanup code: between two models of one cell, free the previous ones.

A K-fold or search loop written plainly (``for fold in folds: model = build(); model.fit()``)
keeps every fold's model in TensorFlow's memory: its traced training graph stays in TF's
gradient registry (and, for a ``tf.function`` train step from an earlier cell, in that
function's trace cache) after nothing of the user's reaches it. While the extension is loaded,
each time an optimizer is built (the start of every new model's training, in ``fit`` and in a
custom loop) and TF registered custom gradients since the last time, the registry is purged of
the graphs nothing else keeps and the traces of variables that died are dropped.

Finding what died takes a garbage collection. A full one costs 0.1-0.4 s in a TF kernel, so
the first time in a cell the objects alive then are frozen (``gc.freeze``, O(1)) and later
collections look only at what the cell made since: each model after the first costs a few ms.
The freeze ends when the cell does (or before any kerasmagic cleanup); outside a cell (a
widget's callback, a silent request) nothing would end it, so there each purge collects in
full. The price: what existed
before that first build and dies later in the same cell (the first fold's model) waits for the
cell's end.
"""

from __future__ import annotations

import functools
import gc
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kerasmagic.backends import purge, registered
from kerasmagic.compat.registry import works
from kerasmagic.imports import AfterImport
from kerasmagic.interrupts.held import held_interrupts
from kerasmagic.shellstate import ShellState

log = logging.getLogger(__name__)
# (module, class, compat's name) whose ``build`` starts every new model's training, Keras 3
# and tf-keras.
OPTIMIZERS = (
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "keras.optimizer_build"),
    ("tf_keras.src.optimizers.optimizer", "_BaseOptimizer", "tf_keras.optimizer_build"),
)
_MARK = "__kerasmagic_between_models__"
# Python 3.12 starts with some of its own objects frozen (375 on 3.12.1; none on 3.11 and
# 3.13); a user's gc.freeze() of a session freezes tens of thousands. Read when the extension
# loads, which may be after a user's freeze: a count that large is theirs, not Python's.
_FROZEN_NOW = gc.get_freeze_count()
STARTUP_FROZEN = _FROZEN_NOW if _FROZEN_NOW < 1000 else 0


class Freezer:
    """Whether kerasmagic froze the collector's old objects (``gc.freeze``) in this cell."""

    frozen = False
    ours = False  # gc.unfreeze() thaws every frozen object: only when none was the user's
    python_frozen = STARTUP_FROZEN  # 0 after our first thaw: gc.unfreeze() thawed them too

    @classmethod
    def freeze(cls) -> None:
        if not cls.frozen:
            if gc.get_freeze_count() <= cls.python_frozen:  # else the user froze: theirs stays
                gc.freeze()
                cls.ours = True
            cls.frozen = True

    @classmethod
    def thaw(cls) -> None:
        """Give the frozen objects back to the collector (cell end, cleanup, unload)."""
        if cls.frozen and cls.ours:
            gc.unfreeze()
            cls.python_frozen = 0  # Python's own startup objects are thawed with ours
        cls.frozen = cls.ours = False


class LoopGuard:
    """Frees the models a loop left behind, each time a new model starts training."""

    def __init__(self, namespace: Mapping[str, Any]) -> None:
        self.namespace = namespace
        self.after = 0  # custom gradients left by the last purge (the models still alive)
        self.patched: list[tuple[type, Callable[..., Any]]] = []
        self.in_cell = False  # between pre_run_cell and post_run_cell: a cell end will thaw
        self._lock = threading.Lock()  # any thread may import Keras, and so install
        self.removed = False

    def install(self) -> None:
        """Wrap the optimizers' ``build`` of the Keras packages imported so far (idempotent;
        nothing once ``uninstall`` ran: an import finishing on another thread after it)."""
        if len(self.patched) == len(OPTIMIZERS) or self.removed:
            return
        with self._lock:
            for module, name, reach in OPTIMIZERS:
                if self.removed or (module in sys.modules and not works(reach)):
                    continue  # uninstalled, or moved: said once, by compat
                cls = getattr(sys.modules.get(module), name, None)
                original = cls.__dict__.get("build") if isinstance(cls, type) else None
                if isinstance(cls, type) and original and not getattr(original, _MARK, False):
                    type.__setattr__(cls, "build", self._wrap(original))
                    self.patched.append((cls, original))

    def uninstall(self) -> None:
        """Put every wrapped ``build`` back, for good."""
        with self._lock:
            self.removed = True
            for cls, original in reversed(self.patched):
                type.__setattr__(cls, "build", original)
            self.patched.clear()
            Freezer.thaw()

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def build(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # read by IPython: Keras's build, as without kerasmagic
            self.between_models()
            return original(optimizer, *args, **kwargs)

        setattr(build, _MARK, True)
        return build

    def pre_run_cell(self, info: Any) -> None:
        """A cell starts: its end will thaw what a model in it freezes."""
        self.in_cell = True
        self.install()  # ~1 us: in case an import hook ahead of ours bypassed it

    def post_run_cell(self, result: Any) -> None:
        """A cell ended: thaw."""
        self.in_cell = False
        Freezer.thaw()

    def between_models(self) -> None:
        """Purge what earlier models left, if TF registered custom gradients since last time."""
        __tracebackhide__ = True
        count = registered()
        if count is None:  # TensorFlow not imported: its registry cannot hold anything
            return
        if not Freezer.frozen and self.in_cell:  # the cell's first new model: nothing to
            Freezer.freeze()  # collect cheaply yet (outside a cell nothing would thaw it)
            self.after = count
            return
        if count <= self.after:
            return
        try:
            with held_interrupts() as held:
                purge(self.namespace)
                self.after = registered() or 0
            held.deliver()
        except Exception:  # never break the user's training (a Ctrl-C is none): log once, go on
            log.warning("kerasmagic: could not free earlier models", exc_info=True)
            self.after = count


def load(state: ShellState) -> tuple[LoopGuard, AfterImport]:
    """Guard the shell's loops: wrap the optimizers as soon as Keras defines them (now, if it is
    imported; else right after its optimizer module is, mid-cell too: a loop in the cell that
    imports Keras is guarded from its first fold), thaw at cell end."""
    shell = state.shell
    guard = LoopGuard(shell.user_ns)
    guard.install()
    shell.events.register("pre_run_cell", guard.pre_run_cell)
    shell.events.register("post_run_cell", guard.post_run_cell)
    hook = AfterImport([module for module, _, _ in OPTIMIZERS], guard.install)
    hook.install()  # last: nothing after it can fail and leave it in sys.meta_path
    return guard, hook


def unload(state: ShellState, hooks: tuple[LoopGuard, AfterImport]) -> None:
    """Unwrap the optimizers and remove the hooks."""
    guard, hook = hooks
    hook.uninstall()
    guard.uninstall()
    state.shell.events.unregister("pre_run_cell", guard.pre_run_cell)
    state.shell.events.unregister("post_run_cell", guard.post_run_cell)
