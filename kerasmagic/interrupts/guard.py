"""The guards around each cell, two loaded parts: ``KernelGuard`` holds a Ctrl-C that lands in
the kernel's own code around a cell, then gives it to the cell; ``ModeGuard`` puts back the
modes a failed cell left switched on the main thread.

ipykernel lets SIGINT raise ``KeyboardInterrupt`` for the whole of an execute request, but only
IPython's cell runner turns one into the cell's error. One that lands in the kernel's code just
before the cell starts or just after it ends escapes to ipykernel, which logs "KeyboardInterrupt
caught in kernel" and never sends the reply: the notebook shows the cell running for ever. One
that lands in an IPython event callback (IPython's own ``pre_execute`` hooks) is printed as
"Error in callback" and the cell runs on to its end.

While the extension is loaded in a kernel, SIGINT is recorded, not raised, from the start of an
execute request until the cell's code is about to run (kerasmagic's AST transformer, first in
line), and again from the end of the cell's code (the first ``post_execute`` callback) until the
reply is sent. A Ctrl-C recorded before the cell stops it at its first line; one recorded while
the end-of-cell callbacks run marks the finished cell as interrupted, as IPython shows one; one
recorded after that is dropped, as on an idle kernel. ``run_cell`` nested in a cell changes
nothing, and a SIGINT handler the cell installs itself is left alone.

Modes: a library switches a mode for the length of a ``with`` block and only the block's exit
switches it back; a Ctrl-C that lands in between skips the exit, and the mode stays switched for the
thread until a restart:

- PyTorch: ``torch.no_grad().__enter__`` switches gradients off (Keras's optimizer step and
  variable assignment enter it on every batch); with them left off, every later ``fit`` fails
  with "element 0 of tensors does not require grad".
- TensorFlow: tracing a ``tf.function`` (``fit``'s first call) runs in graph mode; left there,
  every later ``fit`` fails with "`tf.data.Dataset` only supports Python-style iteration in
  eager mode" (``backends/tensorflow/mode.py``); and TensorFlow's stack of context switches
  keeps the entry of a graph block whose entry or exit was interrupted.

So a cell that started in the default mode and ended in an error with it switched gets it
back, with one line saying so. A cell that succeeds keeps what it set:
``torch.set_grad_enabled(False)`` on purpose is left alone. Stale context switches are dropped
after any cell, with one line: a cell that catches the Ctrl-C (``except KeyboardInterrupt``
around ``fit``) succeeds, and leaves them all the same. Each backend reads and puts back its
own (a backend's ``modes``: ``backends/torch.py``, ``backends/tensorflow/__init__.py``).
"""

from __future__ import annotations

import _signal
import contextlib
import functools
import logging
import sys
import threading
from types import FrameType
from typing import Any

from kerasmagic.backends import NAMES, attempt, get
from kerasmagic.compat.registry import works
from kerasmagic.interrupts.held import CellStopper, Recorder, interrupt_finished_cell, shown_plain
from kerasmagic.interrupts.watch import InterruptWatch, frames_checked
from kerasmagic.shellstate import ShellState

log = logging.getLogger(__name__)
NEEDS = (  # the reaches the kernel guard needs: one moved, and Ctrl-C is left to ipykernel
    "ipykernel.handler_hooks",
    "ipython.events",
    "ipython.transformers",
    "cpython.signal",
    "cpython.frames",
)
HOOKS = ("pre_handler_hook", "post_handler_hook")


class KernelGuard(Recorder):
    """Records SIGINT outside a cell's code during one kernel's execute requests."""

    def __init__(self, shell: Any, kernel: Any) -> None:
        self._shell = shell
        self._kernel = kernel
        self._guarding = False  # an execute request of the main shell is being handled
        self._opener = CellStopper(shell, self.open)  # the cell's code is about to run
        owners = type(shell).__mro__ if works("ipython.run_code", shell) else ()
        codes = (getattr(getattr(owner, "run_code", None), "__code__", None) for owner in owners)
        self._cell_code = {code for code in codes if code is not None}  # none where it moved
        self._watch = InterruptWatch(self._cell_code, enabled=frames_checked())

    def uninstall(self) -> None:
        """Give the kernel its own hooks back and remove everything ``load`` added."""
        for name in HOOKS:
            if vars(self._kernel).get(name) == getattr(self, name):
                delattr(self._kernel, name)
        if self._opener in self._shell.ast_transformers:
            self._shell.ast_transformers.remove(self._opener)
        events = self._shell.events
        for event, callback in ("post_execute", self.close), ("post_run_cell", self.post_run_cell):
            with contextlib.suppress(ValueError):  # not there (IPython's events moved)
                events.unregister(event, callback)
        if self._guarding and _signal.getsignal(_signal.SIGINT) in (self._record, self.interrupt):
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # as ipykernel set it
        self._watch.disarm()
        self._guarding = False

    def pre_handler_hook(self) -> None:
        """Before a shell message: record SIGINT for an execute request, else ipykernel's own.

        ipykernel 7 runs both hooks for a subshell's messages too (JupyterLab's comms), on the
        subshell's thread, while the main thread may be running a cell: signals are the main
        thread's alone, so there they do nothing (ipykernel's own would fail there anyway).
        """
        if threading.current_thread() is not threading.main_thread():
            return
        kernel = self._kernel
        try:
            header = kernel.get_parent("shell").get("header", {})
        except Exception:  # an ipykernel without per-channel parents: leave it alone
            header = {}
        if header.get("msg_type") == "execute_request":
            self.pending = False
            self._guarding = True
            # ipykernel's own hook, with the recorder where it puts Python's default handler.
            kernel.saved_sigint_handler = _signal.signal(_signal.SIGINT, self._record)
        else:
            type(kernel).pre_handler_hook(kernel)

    def post_handler_hook(self) -> None:
        """After a shell message: the reply is out, so a Ctrl-C still held is dropped."""
        if threading.current_thread() is not threading.main_thread():
            return  # a subshell's message ended, not the cell the main thread may be running
        self._guarding = False
        self.pending = False
        type(self._kernel).post_handler_hook(self._kernel)

    def open(self) -> bool:
        """Let Ctrl-C raise from here on; return whether one was held (the cell must stop)."""
        if not self._guarding:
            return False
        if _signal.getsignal(_signal.SIGINT) == self._record:  # else nested, or ipykernel's
            _signal.signal(_signal.SIGINT, self.interrupt)  # own for an async cell
        held, self.pending = self.pending, False
        return held

    def close(self) -> None:
        """The cell's code is over (first ``post_execute`` callback): record SIGINT again.

        The ``comm`` package fires ``post_execute`` after every comm message too, on the thread
        that handled it: a subshell's, while the cell runs, where the cell is not over (and
        ``signal.signal`` raises).
        """
        if threading.current_thread() is not threading.main_thread() or not self._guarding:
            return
        if _signal.getsignal(_signal.SIGINT) == self.interrupt:  # else the cell put its own in
            frame: FrameType | None = sys._getframe(1)
            while frame is not None and frame.f_code not in self._cell_code:
                frame = frame.f_back
            if frame is not None:
                return  # a run_cell nested in a cell: the cell itself is still running
            _signal.signal(_signal.SIGINT, self._record)
        self._watch.disarm()

    def post_run_cell(self, result: Any) -> None:
        """Last ``post_run_cell`` callback: a Ctrl-C held since the cell ended interrupts it."""
        if self._guarding and self.pending:
            self.pending = False
            interrupt_finished_cell(self._shell, result)

    def interrupt(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT while the cell's code runs: raise ``KeyboardInterrupt``, and follow it."""
        __tracebackhide__ = True  # read by IPython's traceback formatter
        error = shown_plain(KeyboardInterrupt())
        self._watch.arm(frame if frame is not None else sys._getframe(1), error)
        raise error

    @classmethod
    def load(cls, state: ShellState) -> KernelGuard | None:
        """The ``kernelguard`` part: guard the shell's kernel, when it is an ipykernel whose
        handler hooks are its own; put the opener and callbacks in place."""
        shell = state.shell
        kernel = getattr(shell, "kernel", None)
        kernelbase = sys.modules.get("ipykernel.kernelbase")
        if kernel is None or kernelbase is None or not all(works(r, shell) for r in NEEDS):
            return None  # one moved: said once, by compat
        base = kernelbase.Kernel
        if not isinstance(kernel, base) or any(
            getattr(type(kernel), hook, None) is not getattr(base, hook) for hook in HOOKS
        ):
            kind = type(kernel).__name__
            log.debug("kerasmagic: %s has its own handler hooks; Ctrl-C left to it", kind)
            return None
        guard = cls(shell, kernel)
        kernel.pre_handler_hook = guard.pre_handler_hook
        kernel.post_handler_hook = guard.post_handler_hook
        shell.ast_transformers.insert(0, guard._opener)
        shell.events.callbacks["post_execute"].insert(0, guard.close)
        shell.events.register("post_run_cell", guard.post_run_cell)
        return guard

    @staticmethod
    def unload(state: ShellState, guard: KernelGuard | None) -> None:
        """Remove the guard, if there was one."""
        if guard is not None:
            guard.uninstall()


class ModeGuard:
    """Remember each backend's modes before each cell (a backend's ``modes``); after it, let each
    put back what a cell that failed left switched, and print what it did."""

    def __init__(self) -> None:
        self.modes = [(name, m) for name in NAMES if (m := get(name).modes) is not None]
        self.before: dict[str, object] = {}

    def pre_run_cell(self, info: Any) -> None:
        self.before = {name: attempt(m.read, None, f"{name}.modes") for name, m in self.modes}

    def post_run_cell(self, result: Any) -> None:
        before, self.before = self.before, {}
        failed = getattr(result, "error_in_exec", None) is not None
        for name, m in self.modes:
            put_back = functools.partial(m.put_back, before.get(name), failed)
            said: list[str] = attempt(put_back, [], f"{name}.modes")
            for line in said:
                print(line)

    @classmethod
    def load(cls, state: ShellState) -> ModeGuard:
        """The ``modes`` part: register the guard's two hooks."""
        guard = cls()
        state.shell.events.register("pre_run_cell", guard.pre_run_cell)
        state.shell.events.register("post_run_cell", guard.post_run_cell)
        return guard

    @staticmethod
    def unload(state: ShellState, guard: ModeGuard) -> None:
        """Remove the hooks."""
        state.shell.events.unregister("pre_run_cell", guard.pre_run_cell)
        state.shell.events.unregister("post_run_cell", guard.post_run_cell)
