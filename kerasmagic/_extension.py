"""Load and unload the IPython extension symmetrically.

The parts are modules listed in ``PARTS``, loaded in that order (a part may use the parts
before it: the sidebar shows the live monitor) and unloaded in reverse. Each has
``load(state) -> handle`` and ``unload(state, handle)``; the handle is kept in the shell's
``ShellState``. A part that fails to load rolls the whole load back, so a retry starts clean.
A ``module:Class`` entry names the class in the module that has the two.
"""

from __future__ import annotations

import contextlib
import logging
import pkgutil
import sys
from typing import Any

from kerasmagic import backends
from kerasmagic.cells.run import RUNNERS
from kerasmagic.cleanup import pin_mmap_threshold
from kerasmagic.compat import notes_at_load, say_once, unwatch, watch
from kerasmagic.compat.registry import works
from kerasmagic.shellstate import STATES, ShellState, state_of

PARTS: tuple[tuple[str, str], ...] = (
    ("oom", "kerasmagic.oom.explain"),  # explains an OOM; before the monitor, whose record has it
    ("live", "kerasmagic.live"),  # the per-cell monitor
    ("sidebar", "kerasmagic.views.comm"),  # shows the monitor: after it
    ("loops", "kerasmagic.cleanup.loops"),
    ("cells", "kerasmagic.cells.run:CellCache"),  # the cells compiled for %%fresh_model
    ("check", "kerasmagic.cells.run:CompileCheck"),  # refuses a body that does not compile: first
    ("await", "kerasmagic.cells.run:AwaitTransformer"),
    ("lost_interrupts", "kerasmagic.interrupts.watch"),
    ("modes", "kerasmagic.interrupts.guard:ModeGuard"),
    ("kernelguard", "kerasmagic.interrupts.guard:KernelGuard"),  # last: its callbacks run after all
)
log = logging.getLogger(__name__)


def load(shell: Any) -> None:
    """Register the magics and parts (once per shell); patch TF stack traces if TF is up."""
    from kerasmagic.magics import KerasMagics

    if state_of(shell) is not None:
        return
    magics = KerasMagics(shell=shell)
    state = STATES[id(shell)] = ShellState(shell, magics)
    try:
        shell.register_magics(magics)
        for name, module in PARTS:
            state.parts[name] = pkgutil.resolve_name(module).load(state)
    except BaseException:
        unload(shell)  # never half loaded: a retry starts from nothing
        raise
    run_code = getattr(type(shell), "run_code", None) if works("ipython.run_code", shell) else None
    codes = (getattr(runner, "__code__", None) for runner in (*RUNNERS, run_code))
    # op traces end at the cell's frames
    backends.attach([c for c in codes if c is not None], magics.patch_stack_traces)
    said = pin_mmap_threshold(magics.mmap_threshold_mb)  # big freed blocks go back to the OS
    if "refused" in said:
        log.warning("kerasmagic: %s", said)
    say_once(notes_at_load(shell))
    watch()  # a framework imported later is checked then


def unload(shell: Any) -> None:
    """Remove the magics, the parts and every patch; leave the user's namespace as it is."""
    state = state_of(shell)
    if state is None:
        return
    for name, module in reversed(PARTS):  # the parts loaded so far, newest first
        if name in state.parts:
            pkgutil.resolve_name(module).unload(state, state.parts.pop(name))
    magics, manager = state.magics, shell.magics_manager
    ours = works("ipython.magics", shell)  # moved: said once, by compat; the magics stay
    for kind, names in magics.magics.items() if ours else ():
        for name in names:  # ours only: not one another extension registered since
            if getattr(manager.magics[kind].get(name), "__self__", None) is magics:
                manager.magics[kind].pop(name, None)
    if ours and manager.registry.get(type(magics).__name__) is magics:
        manager.registry.pop(type(magics).__name__, None)
    with contextlib.suppress(ValueError):  # Magics.__init__ appended it there
        getattr(shell, "configurables", []).remove(magics)
    STATES.pop(id(shell), None)
    if not STATES:
        unwatch()
        backends.detach()
        if "kerasmagic.probes.nvml" in sys.modules:  # never imported: nothing to stop
            sys.modules["kerasmagic.probes.nvml"].stop()
