"""The probes of IPython's, ipykernel's, ipywidgets', CPython's and glibc's structures, each
against the shell kerasmagic loads into where it needs one (``compat/registry.py``)."""

from __future__ import annotations

import contextvars
import inspect
import sys
from typing import Any

from kerasmagic.compat.probe_util import first, has, module


# -- IPython and ipykernel (probed against the shell kerasmagic loads into) --------------------
def compiler(shell: Any) -> str | None:
    return has(shell.compile, "compile", "cache", "extra_flags", "ast_parse", call=True)


def cell_names(shell: Any) -> str | None:
    """IPython 8 names a cell ``Cell In[N]`` through this map; IPython 7 writes N into the
    file name itself and has none."""
    if isinstance(getattr(shell.compile, "_filename_map", None), dict):
        return None
    old = module("IPython").version_info < (8,)
    return None if old else "moved compile._filename_map"


def render_hook(shell: Any) -> str | None:
    """IPython shows an exception whose ``_render_traceback_`` it finds as that method says."""
    showtraceback = inspect.unwrap(type(shell).showtraceback)
    code = getattr(showtraceback, "__code__", None)
    names = set(code.co_names) if code is not None else set()
    return None if "_render_traceback_" in names else "no longer calls _render_traceback_"


def run_code(shell: Any) -> str | None:
    code = getattr(getattr(type(shell), "run_code", None), "__code__", None)
    return None if code is not None else "moved InteractiveShell.run_code"


def traceback(shell: Any) -> str | None:
    """``InteractiveTB.tb`` exists once the debugger ran (ultratb sets it then): cleared when
    there, so only the formatter is checked."""
    return has(shell.InteractiveTB, "InteractiveTB", "structured_traceback", call=True)


def events(shell: Any) -> str | None:
    callbacks = getattr(shell.events, "callbacks", None)
    if isinstance(callbacks, dict) and isinstance(callbacks.get("post_execute"), list):
        return None
    return "moved events.callbacks"


def magics(shell: Any) -> str | None:
    manager = shell.magics_manager
    ok = isinstance(getattr(manager, "magics", None), dict) and isinstance(
        getattr(manager, "registry", None), dict
    )
    return None if ok else "moved magics_manager.magics or .registry"


def output_cache(shell: Any) -> str | None:
    hook = shell.displayhook
    if all(hasattr(hook, n) for n in ("_", "__", "___")) and isinstance(shell.user_ns_hidden, dict):
        return None
    return "moved displayhook._, __, ___ or user_ns_hidden"


def transformers(shell: Any) -> str | None:
    lists = (shell.input_transformers_cleanup, shell.ast_transformers)
    return None if all(isinstance(x, list) for x in lists) else "moved its transformer lists"


def shell_parent(shell: Any) -> str | None:
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "shell_channel_thread"):
        return None  # no kernel, or one without subshells (ipykernel 6): nothing to keep apart
    parent = getattr(kernel, "_shell_parent", None)
    return None if isinstance(parent, contextvars.ContextVar) else "moved Kernel._shell_parent"


def handler_hooks(shell: Any) -> str | None:
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    base = module("ipykernel.kernelbase").Kernel
    return has(base, "Kernel", "pre_handler_hook", "post_handler_hook", call=True)


def io_loop(shell: Any) -> str | None:
    loop = getattr(getattr(shell, "kernel", None), "io_loop", None)
    if getattr(shell, "kernel", None) is None:
        return None
    return has(loop, "kernel.io_loop", "add_callback", "call_later", call=True)


def comm_manager(shell: Any) -> str | None:
    from kerasmagic.views.commmanager import comm_manager

    manager = comm_manager(shell)
    if manager is None:
        return None  # no kernel and no comm package: no frontend to open a sidebar
    return first(
        lambda: has(manager, "comm manager", "register_target", "unregister_target", call=True),
        lambda: None if isinstance(getattr(manager, "targets", None), dict) else "moved .targets",
    )


def widget_messages(_: Any) -> str | None:
    widget = getattr(module("ipywidgets.widgets.widget"), "Widget", None)
    return has(widget, "Widget", "_handle_msg", call=True)


# -- CPython and glibc -------------------------------------------------------------------------
def mallopt(_: Any) -> str | None:
    from kerasmagic.native.heap import _libc

    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return None  # not Linux: nothing to pin, said by %load_ext's own line if asked
    return None if hasattr(libc, "mallopt") else "has no mallopt (not glibc)"


def bytecode(_: Any) -> str | None:
    from kerasmagic.interrupts.pyversions import unchecked

    return None if unchecked() is None else "is not one its opcode-reading code was checked on"
