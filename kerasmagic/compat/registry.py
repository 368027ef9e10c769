"""The one registry of the private structures of other libraries that kerasmagic reaches.

kerasmagic frees what Keras's own cleanup cannot by reaching into TensorFlow, Keras, IPython,
ipykernel and CPython internals. Each is a ``Reach`` in ``REACHES``; ``PRIVATE_NAMES`` maps each
private name the code uses to its reach (``tests/test_registry.py`` fails on one not listed). A
reach is probed (``probes.py``) cheaply and without importing anything, once its module is
imported; the code asks ``works(name)`` where the feature runs, and a reach that does not look as
expected turns off only that feature, said once in one line (``say_once``, the one voice) naming
the feature, the version found and the consequence. ``%gpu_mem --json`` lists what is off.
``verified`` is what CI's venvs check (``tests/test_reaches.py`` on every TensorFlow/Keras pair).
"""

from __future__ import annotations

import logging
import platform
import sys
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from kerasmagic.compat import probes as p
from kerasmagic.compat.probes import CONTEXT, FUNCTION, OPS, STACK, STATE

log = logging.getLogger("kerasmagic.compat")
_said: set[str] = set()  # each line once per process, however often the extension loads


def say_once(lines: list[str], exc_info: bool = False) -> None:
    """Say each line not said before in this process, one warning each (``exc_info``: with the
    traceback of the exception being handled)."""
    for line in (x for x in lines if x not in _said):  # lazily: a repeat is said once
        _said.add(line)
        log.warning(line, exc_info=exc_info or None)


def installed(distribution: str, module: str) -> str | None:
    """Return the version of ``module`` if imported, else of the installed distribution."""
    if isinstance(loaded := getattr(sys.modules.get(module), "__version__", None), str):
        return loaded
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# A reach's name prefix -> the distribution whose version is named, and the versions CI checks.
LIBRARIES = {
    "tf": ("tensorflow", "tensorflow 2.16-2.21"), "tf_keras": ("tf-keras", "tf-keras 2.21"),
    "keras": ("keras", "keras 3.3-3.15"), "jax": ("jax", "jax 0.4.30-0.10"),
    "torch": ("torch", "torch 2.4-2.13"), "cpython": ("cpython", "CPython 3.11-3.13"),
    "ipython": ("ipython", "IPython 7.34-9.x"), "ipykernel": ("ipykernel", "ipykernel 6.17-7.x"),
    "ipywidgets": ("ipywidgets", "ipywidgets 7.7.1-8.1"), "glibc": ("glibc", "glibc 2.36"),
}  # fmt: skip
SHELL_LIBRARIES = ("ipython", "ipykernel")  # probed against a shell, never without one


@dataclass(frozen=True)
class Reach:
    """One private structure: where it is, what needs it, what is lost without it."""

    name: str  # "keras.global_state": its prefix names the library (``LIBRARIES``)
    module: str  # probed once this module is imported
    structure: str  # what is read or written
    access: str  # "read" or "write"
    feature: str  # what kerasmagic does with it
    consequence: str  # the line's first words when it is off
    probe: p.Probe  # given the shell (or None): None, or what differs

    @property
    def library(self) -> str:
        """Return the distribution whose version is named: "keras", "tensorflow", "ipython"."""
        return LIBRARIES[self.name.partition(".")[0]][0]

    @property
    def verified(self) -> str:
        """Return the versions CI checks it on."""
        return LIBRARIES[self.name.partition(".")[0]][1]

    def version(self) -> str | None:
        """Return the version of the library found here."""
        if self.library == "cpython":
            return ".".join(map(str, sys.version_info[:3]))
        if self.library == "glibc":
            return platform.libc_ver()[1] or None
        return installed(self.library, self.module.partition(".")[0])


@dataclass(frozen=True)
class Off:
    """A reach that did not look as expected: its feature is off."""

    reach: Reach
    version: str | None
    found: str  # what differs, in words ("moved global_state.get_global_attribute")

    @property
    def line(self) -> str:
        """Return the one line said when it is found."""
        reach, version = self.reach, self.version or "(version unknown)"
        said = f"kerasmagic: {reach.consequence}: {reach.library} {version} {self.found}"
        return f"{said} (checked on {reach.verified})"

    def to_dict(self) -> dict[str, Any]:
        """Return what ``%gpu_mem --json`` lists for it."""
        keys = ("structure", "feature", "consequence", "library")
        found = {"version": self.version, "found": self.found, "line": self.line}
        return {"reach": self.reach.name, **{k: getattr(self.reach, k) for k in keys}, **found}


_results: dict[str, Off | None] = {}  # reach name -> its finding (None: as expected)
_lock = threading.Lock()


def probe(reach: Reach, shell: Any = None) -> Off | None:
    """Probe one reach now; return what is off, or None when it looks as expected."""
    try:
        found = reach.probe(shell)
    except Exception as exc:  # a probe that fails found a structure it cannot read
        found = f"failed the check ({type(exc).__name__}: {exc})"
    return None if found is None else Off(reach, reach.version(), found)


def loaded(module: str, finished: frozenset[str] = frozenset()) -> Any | None:
    """Return ``module`` once it and its package are imported and done importing, else None.

    A module still running its code (``import tensorflow`` on the main thread, seen from the
    sampler's) has not defined everything yet: a probe then would find it "moved". ``finished``:
    top packages whose code has just run (a post-import hook runs before importlib says so).
    Asked every cell: a few dict lookups when the module is there.
    """
    for name in (module.partition(".")[0], module):
        found = sys.modules.get(name)
        spec = None if name in finished else getattr(found, "__spec__", None)
        if found is None or getattr(spec, "_initializing", False) is True:  # cpython.module_spec
            return None
    return found


def ready(module: str, finished: frozenset[str] = frozenset()) -> bool:
    """Return whether ``module`` and its package are imported and done importing."""
    return loaded(module, finished) is not None


def _record(reach: Reach, shell: Any) -> Off | None:
    """Probe ``reach`` and keep the finding; return it if it is off and new."""
    found = probe(reach, shell)
    with _lock:
        before, _results[reach.name] = _results.get(reach.name), found
    new = found is not None and (before is None or before.found != found.found)
    return found if new else None


def check(
    shell: Any = None, again: bool = False, finished: frozenset[str] = frozenset()
) -> list[Off]:
    """Probe every reach whose module is imported and not probed yet (``again``: all of them);
    return the newly found ones that are off."""
    due = [r for r in REACHES if (again or r.name not in _results) and ready(r.module, finished)]
    due = [r for r in due if shell is not None or r.library not in SHELL_LIBRARIES]  # %load_ext
    return [found for r in due if (found := _record(r, shell)) is not None]


def works(name: str, shell: Any = None) -> bool:
    """Return whether the reach ``name`` looks as expected (probed now, against ``shell`` or
    the running one, if its module was imported since the last check; said once when it does
    not). An IPython or ipykernel reach with no shell to probe is not probed yet."""
    if name not in _results:
        reach = _BY_NAME[name]  # KeyError: every caller names a reach of REACHES
        if shell is None and (ipython := sys.modules.get("IPython")) is not None:
            shell = ipython.get_ipython()
        if reach.library in SHELL_LIBRARIES and shell is None:
            return True
        if ready(reach.module) and (found := _record(reach, shell)) is not None:
            say_once([found.line])
    return _results.get(name) is None


def broken(name: str, found: str) -> None:
    """Record that kerasmagic found the reach ``name`` not as expected while using it (a
    structure a probe cannot see without a live object); say it once; its feature is off."""
    if _results.get(name) is None:
        _results[name] = off = Off(reach := _BY_NAME[name], reach.version(), found)
        say_once([off.line])


def off() -> list[Off]:
    """Return every reach found off so far, in the registry's order."""
    return [found for r in REACHES if (found := _results.get(r.name)) is not None]


def forget() -> None:
    """Forget every finding (tests; a framework reloaded)."""
    _results.clear()


_FRESH = "%%fresh_model"  # the table's repeated words and modules
_GRAPHS = f"fitted models' training graphs stay in TensorFlow's memory after {_FRESH}"
_STACKS = "op stack traces are TensorFlow's own (each re-run of a cell that fits keeps ~0.5 MB)"
_HEADS = "dropped heads stay linked to kept base models (their weights stay)"
_KERNEL = "ipykernel.kernelbase"
_SHELL = "IPython.core.interactiveshell"
_SWALLOWED = "a Ctrl-C a library swallows is left to Python"
# fmt: off
# Reach(name, module, structure, access, feature, consequence when off, probe)
REACHES: tuple[Reach, ...] = (
    Reach("tf.gradient_registry", OPS, "ops.gradient_registry._registry", "write",
        "releases fitted models' training graphs (the gradient-registry purge)", _GRAPHS,
        p.gradient_registry),
    Reach("tf.graph_attributes", OPS, "attributes set on ops.Graph objects", "write",
        "parks a graph's registry entries while it collects", _GRAPHS, p.graph_class),
    Reach("tf.context", CONTEXT, "context()._context_handle, list_function_names", "read",
        "reads TensorFlow's allocator figures and its function count",
        "TensorFlow's allocator figures are not shown", p.context),
    Reach("tf.modes", CONTEXT, "context().context_switches.stack, _thread_local_data.is_eager",
        "write", "puts TensorFlow back in eager mode after a Ctrl-C mid-trace",
        "eager mode is not restored after a Ctrl-C stops a trace", p.modes),
    Reach("tf.op_seeds", CONTEXT, "context()._rng (random.Random)", "write",
        "predict_fit puts TensorFlow's op-seed generator back (a seeded shuffle draws from it)",
        "after predict_fit, a seeded fit shuffles in another order", p.op_seeds),
    Reach("tf.function_traces", FUNCTION,
        "Function._variable_creation_config, FunctionCache._primary and delete()", "write",
        "clears the traces a tf.function from an earlier cell keeps of dropped models",
        "a tf.function from an earlier cell keeps every model it traced", p.traces),
    Reach("tf.first_call_initializers", FUNCTION,
        "the add_initializers_to list of Function._initialize", "write",
        "frees the variables a tf.function created on its first call",
        "a tf.function that built its optimizer keeps that optimizer's first model", p.first_call),
    Reach("tf.stack_capture", STACK,
        "tf_stack.extract_stack (replaced), _source_mapper_stacks, _tf_stack", "write",
        "records op stack traces as strings", _STACKS, p.stack),
    Reach("tf.debug_info", STACK, "GraphDebugInfo bytes read by _tf_stack.LoadTracesFromDebugInfo",
        "write", "records op stack traces as strings", _STACKS, p.debug_info),
    Reach("tf.traced_graphs", FUNCTION, "Function._list_all_concrete_functions", "read",
        "counts the ops a model's traced functions hold (%gpu_mem --deep)",
        "traced ops show as unknown in %gpu_mem --deep", p.traced_graphs),
    Reach("keras.global_state", STATE, "global_state.get/set_global_attribute", "write",
        "keeps Keras settings across clear_session()",
        f"mixed-precision policy and random seed are not kept across {_FRESH}", p.global_state),
    Reach("keras.name_uids", STATE, "global_state 'object_name_uids'", "read",
        "counts auto-named layers", "the layer-name counter is not shown", p.name_uids),
    Reach("keras.variables", "keras.src.backend.common.variables",
        "backend.common.variables.Variable", "read", "counts Keras variables as model state",
        f"loose Keras variables are not dropped by {_FRESH}", p.variables),
    Reach("keras.flatten_layers", "keras.src.layers.layer", "Layer._flatten_layers", "read",
        "knows what a kept model owns", f"{_FRESH} may name layers of kept models as dropped",
        p.flatten),
    Reach("keras.outbound_nodes", "keras.src.ops.operation",
        "Operation._outbound_nodes, Node.operation", "write",
        "unlinks dropped heads from the graphs of kept base models", _HEADS, p.outbound),
    Reach("keras.keras_history", "keras.src.ops.node", "KerasTensor._keras_history", "read",
        "keeps the symbolic tensors of kept models",
        f"{_FRESH} cannot tell which symbolic tensors kept models use", p.history),
    Reach("keras.callback_model", "keras.src.callbacks.callback", "Callback._model", "write",
        "cuts History.model, so an old model goes while its numbers stay",
        "history.model keeps old models alive", p.callback),
    Reach("keras.optimizer_build", "keras.src.optimizers.base_optimizer",
        "BaseOptimizer.build (wrapped)", "write", "frees between the models of one loop",
        "a loop in one cell keeps every model it trains", p.optimizer_build),
    Reach("keras.backend_name", "keras.src.backend.config", "backend.config.backend()", "read",
        "tells which backend Keras runs on", "the Keras backend is guessed from what is imported",
        p.backend_name),
    Reach("keras.sequential_inner", "keras.src.models.sequential", "Sequential._functional", "read",
        "counts a Sequential once, not with its inner model",
        "a Sequential is listed twice in %gpu_mem --deep", p.sequential),
    Reach("keras.train_function", "keras.src.models.model", "Model.make_train_function(force=)",
        "write", "find_batch_size leaves the model as it came", "find_batch_size is off",
        p.trainer),
    Reach("tf_keras.name_uids", "tf_keras.src.backend", "backend.PER_GRAPH_OBJECT_NAME_UIDS",
        "read", "counts auto-named layers (tf-keras)", "the layer-name counter is not shown",
        p.tf_keras_uids),
    Reach("tf_keras.outbound_nodes", "tf_keras.src.engine.base_layer",
        "Layer._outbound_nodes_value", "write", "unlinks dropped heads from kept base models",
        _HEADS, p.tf_keras_outbound),
    Reach("tf_keras.optimizer_build", "tf_keras.src.optimizers.optimizer",
        "_BaseOptimizer.build (wrapped)", "write", "frees between the models of one loop",
        "a loop in one cell keeps every model it trains", p.tf_keras_build),
    Reach("jax.started", "jax._src.xla_bridge", "xla_bridge.backends_are_initialized", "read",
        "tells whether JAX has started its devices",
        "JAX's figures are shown only once Keras runs on it", p.jax_started),
    Reach("jax.compiled", "jax._src.interpreters.pxla", "pxla._cached_compilation", "read",
        "counts JAX's compiled functions", "JAX's compiled-function count is not shown",
        p.jax_compiled),
    Reach("torch.dynamo", "torch._dynamo", "torch._dynamo.reset", "write",
        "empties torch.compile's caches", f"torch.compile's caches are kept by {_FRESH}", p.dynamo),
    Reach("ipython.compiler", "IPython.core.compilerop", "compile.cache/extra_flags/ast_parse",
        "read", "compiles a %%fresh_model cell as a plain cell", f"{_FRESH} is off", p.compiler),
    Reach("ipython.cell_names", "IPython.core.compilerop", "compile._filename_map", "write",
        "names a re-run %%fresh_model cell's code In[N] in tracebacks",
        f"a re-run {_FRESH} cell's traceback names the In[N] of its first run", p.cell_names),
    Reach("ipython.render_hook", _SHELL, "showtraceback's call of _render_traceback_", "read",
        "shows a %%fresh_model cell's error from the cell's own line",
        "a %%fresh_model cell's error shows IPython's and kerasmagic's frames", p.render_hook),
    Reach("ipython.run_code", _SHELL, "InteractiveShell.run_code's code", "read",
        "finds where a cell starts in a stack",
        "stored tracebacks and op stack traces reach above the cell", p.run_code),
    Reach("ipython.traceback", "IPython.core.ultratb",
        "InteractiveTB.structured_traceback (and .tb, once set)", "write",
        "drops a stored error's frames; shows errors from the cell's line",
        "a stored error keeps its models", p.traceback),
    Reach("ipython.events", "IPython.core.events", "events.callbacks['post_execute']", "write",
        "holds Ctrl-C from the cell's last line on", "a Ctrl-C just after a cell may be lost",
        p.events),
    Reach("ipython.magics", "IPython.core.magic", "magics_manager.magics, .registry", "write",
        "removes the magics at %unload_ext", "%unload_ext leaves the magics", p.magics),
    Reach("ipython.output_cache", "IPython.core.displayhook",
        "displayhook._, __, ___, user_ns_hidden", "write", "drops models held by Out[] and _",
        "models shown as a cell's value stay alive", p.output_cache),
    Reach("ipython.transformers", _SHELL, "input_transformers_cleanup, ast_transformers", "write",
        "refuses a cell that does not compile; awaits at top level",
        f"{_FRESH} cells are checked only when they run", p.transformers),
    Reach("ipykernel.shell_parent", _KERNEL, "Kernel._shell_parent", "write",
        "answers the sidebar while a cell runs", "sidebar requests wait for the running cell",
        p.shell_parent),
    Reach("ipykernel.handler_hooks", _KERNEL, "Kernel.pre_handler_hook, post_handler_hook", "write",
        "holds a Ctrl-C that lands in the kernel's code around a cell",
        "a Ctrl-C just before or after a cell is left to ipykernel", p.handler_hooks),
    Reach("ipykernel.io_loop", _KERNEL, "kernel.io_loop", "read",
        "runs the sidebar's Free memory and Scan between cells",
        "the sidebar's Free memory and Scan are off", p.io_loop),
    Reach("ipykernel.comm_manager", _KERNEL, "the comm manager's register_target and targets",
        "write", "opens the sidebar", "the sidebar cannot connect", p.comm_manager),
    Reach("ipywidgets.handle_msg", "ipywidgets.widgets.widget", "Widget._handle_msg (overridden)",
        "write", "drops a malformed frontend message quietly",
        "a malformed widget message prints a traceback", p.widget_messages),
    Reach("glibc.mallopt", "ctypes",
        "mallopt(M_MMAP_THRESHOLD), malloc_trim; Linux prctl in an isolated child", "write",
        "keeps big freed blocks off the heap, so RSS falls when memory is freed",
        "RSS may stay up after memory is freed", p.mallopt),
    Reach("cpython.bytecode", "dis", "opcodes, exception tables, tracing", "read",
        "raises again a Ctrl-C a library swallowed or a callback lost", _SWALLOWED, p.bytecode),
    Reach("cpython.frames", "sys", "sys._getframe", "read",
        "finds the frames of the running cell and of kerasmagic's own code", _SWALLOWED, p.frames),
    Reach("cpython.signal", "_signal", "the _signal module's signal()", "write",
        "holds a Ctrl-C while kerasmagic works, without Python's signal wrappers",
        "a Ctrl-C during kerasmagic's cleanup is not held", p.signal_module),
    Reach("cpython.module_spec", "importlib", "ModuleSpec._initializing", "read",
        "waits for a framework to finish importing before reading it",
        "a framework still importing may be read too early", p.module_spec),
    Reach("cpython.referrers", "gc", "gc.get_referrers, gc.get_objects", "read",
        "names what holds a model (%gpu_mem --deep, the sidebar's Scan)",
        "%gpu_mem --deep cannot say what holds a model", p.referrers),
)
# fmt: on

_BY_NAME: dict[str, Reach] = {reach.name: reach for reach in REACHES}

# Each reach -> the private names of other libraries the code uses for its feature (inverted into
# PRIVATE_NAMES; tests/test_registry.py parses the package and fails on a name not listed here).
_NAMES = {
    "tf.gradient_registry": "_registry", "tf.context": "_context_handle",
    "tf.modes": "_default_graph_stack _thread_local_data", "tf.op_seeds": "_rng",
    "tf.function_traces": "_concrete_variable_creation_fn _created_variables _dispatch_dict "
    "_function_cache _no_variable_creation_config _primary _variable_creation_config "
    "_weak_variables",
    "tf.first_call_initializers": "_initialize",
    "tf.stack_capture": "_create_c_op _source_filter_stacks _source_mapper_stacks _tf_stack",
    "tf.traced_graphs": "_functions _list_all_concrete_functions", "keras.variables": "_value",
    "keras.flatten_layers": "_flatten_layers",
    "keras.outbound_nodes": "_inbound_nodes _outbound_nodes",
    "keras.keras_history": "_keras_history", "keras.callback_model": "_model",
    "keras.sequential_inner": "_functional _maybe_rebuild",
    "tf_keras.outbound_nodes": "_outbound_nodes_value",
    "tf_keras.optimizer_build": "_BaseOptimizer", "jax.compiled": "_cached_compilation",
    "ipython.cell_names": "_filename_map", "ipykernel.shell_parent": "_shell_parent",
    "glibc.mallopt": "ctypes", "cpython.bytecode": "_parse_exception_table",
    "cpython.frames": "_getframe", "cpython.signal": "_signal",
    "cpython.module_spec": "_initializing _bootstrap _load_unlocked",
    "cpython.referrers": "gc.get_referrers gc.get_objects",
}  # fmt: skip
PRIVATE_NAMES: dict[str, str] = {n: reach for reach, names in _NAMES.items() for n in names.split()}
