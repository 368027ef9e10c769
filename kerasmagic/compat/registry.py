"""The one registry of the private structures of other libraries that kerasmagic reaches.

kerasmagic frees what Keras's own cleanup cannot by reaching into TensorFlow, Keras, IPython,
ipykernel and CPython internals. Each is a ``Reach`` in ``REACHES``, naming the private names it
uses (``names``; ``tests/test_registry.py`` fails on a private name of another library the code
uses that no entry names). A reach is probed (``probes.py``) cheaply and without importing
anything, once its module is imported; the code asks ``works(name)`` where the feature runs, and
a reach that does not look as expected turns off only that feature, said once in one line
(``say_once``, the one voice) naming the feature, the version found and the consequence.
``%gpu_mem --json`` lists what is off. ``verified`` is what CI's venvs check
(``tests/test_reaches.py`` on every TensorFlow/Keras pair).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
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
    for line in lines:
        if line not in _said:
            _said.add(line)
            log.warning(line, exc_info=exc_info or None)


def installed(distribution: str, module: str) -> str | None:
    """Return the version of ``module`` if imported, else of the installed distribution."""
    loaded = getattr(sys.modules.get(module), "__version__", None)
    if isinstance(loaded, str):
        return loaded
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


Probe = Callable[[Any], "str | None"]  # given the shell (or None): None, or what differs


@dataclass(frozen=True)
class Reach:
    """One private structure: where it is, what needs it, what is lost without it."""

    name: str  # "keras.global_state"
    library: str  # the distribution whose version is named: "keras", "tensorflow", "ipython"
    module: str  # probed once this module is imported
    structure: str  # what is read or written
    access: str  # "read" or "write"
    feature: str  # what kerasmagic does with it
    consequence: str  # the line's first words when it is off
    verified: str  # the versions CI checks it on
    probe: Probe


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
        return (
            f"kerasmagic: {reach.consequence}: {reach.library} {version} {self.found} "
            f"(checked on {reach.verified})"
        )

    def to_dict(self) -> dict[str, Any]:
        """Return what ``%gpu_mem --json`` lists for it."""
        reach = self.reach
        return {
            "reach": reach.name,
            "structure": reach.structure,
            "feature": reach.feature,
            "consequence": reach.consequence,
            "library": reach.library,
            "version": self.version,
            "found": self.found,
            "line": self.line,
        }


_results: dict[str, Off | None] = {}  # reach name -> its finding (None: as expected)
_lock = threading.Lock()


def probe(reach: Reach, shell: Any = None) -> Off | None:
    """Probe one reach now; return what is off, or None when it looks as expected."""
    try:
        found = reach.probe(shell)
    except Exception as exc:  # a probe that fails found a structure it cannot read
        found = f"failed the check ({type(exc).__name__}: {exc})"
    return None if found is None else _with_version(reach, found)


def _with_version(reach: Reach, found: str) -> Off:
    if reach.library == "cpython":
        version: str | None = ".".join(map(str, sys.version_info[:3]))
    elif reach.library == "glibc":
        import platform

        version = platform.libc_ver()[1] or None
    else:
        version = installed(reach.library, reach.module.partition(".")[0])
    return Off(reach, version, found)


def ready(module: str, finished: frozenset[str] = frozenset()) -> bool:
    """Return whether ``module`` and its package are imported and done importing: a module
    still running its code (``import tensorflow`` on the main thread, seen from the sampler's)
    has not defined everything yet, and a probe then would find it "moved". ``finished``: top
    packages whose code has just run (a post-import hook runs before importlib says so)."""
    top = module.partition(".")[0]
    for name in (top, module):
        found = sys.modules.get(name)
        if found is None:
            return False
        if name not in finished and _importing(found):
            return False
    return True


def _importing(module: Any) -> bool:
    """Return whether ``module``'s code is still running (reach ``cpython.module_spec``)."""
    spec = getattr(module, "__spec__", None)
    return spec is not None and getattr(spec, "_initializing", False) is True


def loaded(module: str) -> Any | None:
    """Return ``module`` once it and its package are imported and done importing, else None
    (asked every cell: two dict lookups when the module is there)."""
    found = sys.modules.get(module)
    top = sys.modules.get(module.partition(".")[0])
    if found is None or top is None or _importing(top) or _importing(found):
        return None
    return found


def check(
    shell: Any = None, again: bool = False, finished: frozenset[str] = frozenset()
) -> list[Off]:
    """Probe every reach whose module is imported and not probed yet (``again``: all of them);
    return the newly found ones that are off."""
    new: list[Off] = []
    for reach in REACHES:
        if not ready(reach.module, finished) or (reach.name in _results and not again):
            continue
        if reach.library in ("ipython", "ipykernel") and shell is None:
            continue  # probed against a shell, at %load_ext
        found = probe(reach, shell)
        with _lock:
            before = _results.get(reach.name)
            _results[reach.name] = found
        fresh = before is None or before.found != getattr(found, "found", None)
        if found is not None and fresh:
            new.append(found)
    return new


def works(name: str, shell: Any = None) -> bool:
    """Return whether the reach ``name`` looks as expected (probed now, against ``shell`` or
    the running one, if its module was imported since the last check; said once when it does
    not). An IPython or ipykernel reach with no shell to probe is not probed yet."""
    if name not in _results:
        reach = _BY_NAME.get(name)
        if reach is None:
            raise KeyError(f"kerasmagic names no reach {name!r}")
        shell = _current_shell() if shell is None else shell
        if reach.library in ("ipython", "ipykernel") and shell is None:
            return True
        if ready(reach.module):
            found = probe(reach, shell)
            _results[name] = found
            if found is not None:
                say_once([found.line])
    return _results.get(name) is None


def broken(name: str, found: str) -> None:
    """Record that kerasmagic found the reach ``name`` not as expected while using it (a
    structure a probe cannot see without a live object); say it once; its feature is off."""
    reach = _BY_NAME[name]
    if _results.get(name) is not None:
        return
    off = _with_version(reach, found)
    _results[name] = off
    say_once([off.line])


def off() -> list[Off]:
    """Return every reach found off so far, in the registry's order."""
    return [found for r in REACHES if (found := _results.get(r.name)) is not None]


def forget() -> None:
    """Forget every finding (tests; a framework reloaded)."""
    _results.clear()


def _current_shell() -> Any:
    ipython = sys.modules.get("IPython")
    return None if ipython is None else ipython.get_ipython()


TF = "tensorflow 2.16-2.21"
KERAS = "keras 3.3-3.15"
TF_KERAS = "tf-keras 2.21"
IPYTHON = "IPython 7.34-9.x"
IPYKERNEL = "ipykernel 6.17-7.x"


def _r(name: str, library: str, module: str, structure: str, access: str, feature: str,
       consequence: str, verified: str, probe: Callable[[Any], str | None]) -> Reach:  # fmt: skip
    return Reach(name, library, module, structure, access, feature, consequence, verified, probe)


_FRESH = "%%fresh_model"
# fmt: off
# (name, library, module, structure, access, feature, consequence when off, verified, probe)
REACHES: tuple[Reach, ...] = (
    _r("tf.gradient_registry", "tensorflow", OPS, "ops.gradient_registry._registry", "write",
       "releases fitted models' training graphs (the gradient-registry purge)",
       f"fitted models' training graphs stay in TensorFlow's memory after {_FRESH}", TF,
       p.gradient_registry),
    _r("tf.graph_attributes", "tensorflow", OPS, "attributes set on ops.Graph objects", "write",
       "parks a graph's registry entries while it collects",
       f"fitted models' training graphs stay in TensorFlow's memory after {_FRESH}", TF,
       p.graph_class),
    _r("tf.context", "tensorflow", CONTEXT, "context()._context_handle, list_function_names",
       "read", "reads TensorFlow's allocator figures and its function count",
       "TensorFlow's allocator figures are not shown", TF, p.context),
    _r("tf.modes", "tensorflow", CONTEXT,
       "context().context_switches.stack, _thread_local_data.is_eager", "write",
       "puts TensorFlow back in eager mode after a Ctrl-C mid-trace",
       "eager mode is not restored after a Ctrl-C stops a trace", TF, p.modes),
    _r("tf.op_seeds", "tensorflow", CONTEXT, "context()._rng (random.Random)", "write",
       "predict_fit puts TensorFlow's op-seed generator back (a seeded shuffle draws from it)",
       "after predict_fit, a seeded fit shuffles in another order", TF, p.op_seeds),
    _r("tf.function_traces", "tensorflow", FUNCTION,
       "Function._variable_creation_config, FunctionCache._primary and delete()", "write",
       "clears the traces a tf.function from an earlier cell keeps of dropped models",
       "a tf.function from an earlier cell keeps every model it traced", TF, p.traces),
    _r("tf.first_call_initializers", "tensorflow", FUNCTION,
       "the add_initializers_to list of Function._initialize", "write",
       "frees the variables a tf.function created on its first call",
       "a tf.function that built its optimizer keeps that optimizer's first model", TF,
       p.first_call),
    _r("tf.stack_capture", "tensorflow", STACK,
       "tf_stack.extract_stack (replaced), _source_mapper_stacks, _tf_stack", "write",
       "records op stack traces as strings", "op stack traces are TensorFlow's own (each "
       "re-run of a cell that fits keeps ~0.5 MB)", TF, p.stack),
    _r("tf.debug_info", "tensorflow", STACK,
       "GraphDebugInfo bytes read by _tf_stack.LoadTracesFromDebugInfo", "write",
       "records op stack traces as strings", "op stack traces are TensorFlow's own (each "
       "re-run of a cell that fits keeps ~0.5 MB)", TF, p.debug_info),
    _r("tf.traced_graphs", "tensorflow", FUNCTION, "Function._list_all_concrete_functions",
       "read", "counts the ops a model's traced functions hold (%gpu_mem --deep)",
       "traced ops show as unknown in %gpu_mem --deep", TF, p.traced_graphs),
    _r("keras.global_state", "keras", STATE, "global_state.get/set_global_attribute", "write",
       "keeps Keras settings across clear_session()",
       f"mixed-precision policy and random seed are not kept across {_FRESH}", KERAS,
       p.global_state),
    _r("keras.name_uids", "keras", STATE, "global_state 'object_name_uids'", "read",
       "counts auto-named layers", "the layer-name counter is not shown", KERAS, p.name_uids),
    _r("keras.variables", "keras", "keras.src.backend.common.variables",
       "backend.common.variables.Variable", "read", "counts Keras variables as model state",
       f"loose Keras variables are not dropped by {_FRESH}", KERAS, p.variables),
    _r("keras.flatten_layers", "keras", "keras.src.layers.layer", "Layer._flatten_layers",
       "read", "knows what a kept model owns",
       f"{_FRESH} may name layers of kept models as dropped", KERAS, p.flatten),
    _r("keras.outbound_nodes", "keras", "keras.src.ops.operation",
       "Operation._outbound_nodes, Node.operation", "write",
       "unlinks dropped heads from the graphs of kept base models",
       "dropped heads stay linked to kept base models (their weights stay)", KERAS, p.outbound),
    _r("keras.keras_history", "keras", "keras.src.ops.node", "KerasTensor._keras_history",
       "read", "keeps the symbolic tensors of kept models",
       f"{_FRESH} cannot tell which symbolic tensors kept models use", KERAS, p.history),
    _r("keras.callback_model", "keras", "keras.src.callbacks.callback", "Callback._model",
       "write", "cuts History.model, so an old model goes while its numbers stay",
       "history.model keeps old models alive", KERAS, p.callback),
    _r("keras.optimizer_build", "keras", "keras.src.optimizers.base_optimizer",
       "BaseOptimizer.build (wrapped)", "write", "frees between the models of one loop",
       "a loop in one cell keeps every model it trains", KERAS, p.optimizer_build),
    _r("keras.backend_name", "keras", "keras.src.backend.config", "backend.config.backend()",
       "read", "tells which backend Keras runs on",
       "the Keras backend is guessed from what is imported", KERAS, p.backend_name),
    _r("keras.sequential_inner", "keras", "keras.src.models.sequential",
       "Sequential._functional", "read", "counts a Sequential once, not with its inner model",
       "a Sequential is listed twice in %gpu_mem --deep", KERAS, p.sequential),
    _r("keras.train_function", "keras", "keras.src.models.model",
       "Model.make_train_function(force=)", "write",
       "find_batch_size leaves the model as it came", "find_batch_size is off", KERAS, p.trainer),
    _r("tf_keras.name_uids", "tf-keras", "tf_keras.src.backend",
       "backend.PER_GRAPH_OBJECT_NAME_UIDS", "read", "counts auto-named layers (tf-keras)",
       "the layer-name counter is not shown", TF_KERAS, p.tf_keras_uids),
    _r("tf_keras.outbound_nodes", "tf-keras", "tf_keras.src.engine.base_layer",
       "Layer._outbound_nodes_value", "write", "unlinks dropped heads from kept base models",
       "dropped heads stay linked to kept base models (their weights stay)", TF_KERAS,
       p.tf_keras_outbound),
    _r("tf_keras.optimizer_build", "tf-keras", "tf_keras.src.optimizers.optimizer",
       "_BaseOptimizer.build (wrapped)", "write", "frees between the models of one loop",
       "a loop in one cell keeps every model it trains", TF_KERAS, p.tf_keras_build),
    _r("jax.started", "jax", "jax._src.xla_bridge", "xla_bridge.backends_are_initialized",
       "read", "tells whether JAX has started its devices",
       "JAX's figures are shown only once Keras runs on it", "jax 0.4.30-0.10", p.jax_started),
    _r("jax.compiled", "jax", "jax._src.interpreters.pxla", "pxla._cached_compilation",
       "read", "counts JAX's compiled functions", "JAX's compiled-function count is not shown",
       "jax 0.4.30-0.10", p.jax_compiled),
    _r("torch.dynamo", "torch", "torch._dynamo", "torch._dynamo.reset", "write",
       "empties torch.compile's caches", f"torch.compile's caches are kept by {_FRESH}",
       "torch 2.4-2.13", p.dynamo),
    _r("ipython.compiler", "ipython", "IPython.core.compilerop",
       "compile.cache/extra_flags/ast_parse", "read",
       "compiles a %%fresh_model cell as a plain cell", f"{_FRESH} is off", IPYTHON, p.compiler),
    _r("ipython.cell_names", "ipython", "IPython.core.compilerop", "compile._filename_map",
       "write", "names a re-run %%fresh_model cell's code In[N] in tracebacks",
       f"a re-run {_FRESH} cell's traceback names the In[N] of its first run", IPYTHON,
       p.cell_names),
    _r("ipython.render_hook", "ipython", "IPython.core.interactiveshell",
       "showtraceback's call of _render_traceback_", "read",
       "shows a %%fresh_model cell's error from the cell's own line",
       "a %%fresh_model cell's error shows IPython's and kerasmagic's frames", IPYTHON,
       p.render_hook),
    _r("ipython.run_code", "ipython", "IPython.core.interactiveshell",
       "InteractiveShell.run_code's code", "read", "finds where a cell starts in a stack",
       "stored tracebacks and op stack traces reach above the cell", IPYTHON, p.run_code),
    _r("ipython.traceback", "ipython", "IPython.core.ultratb",
       "InteractiveTB.structured_traceback (and .tb, once set)", "write",
       "drops a stored error's frames; shows errors from the cell's line",
       "a stored error keeps its models", IPYTHON, p.traceback),
    _r("ipython.events", "ipython", "IPython.core.events", "events.callbacks['post_execute']",
       "write", "holds Ctrl-C from the cell's last line on",
       "a Ctrl-C just after a cell may be lost", IPYTHON, p.events),
    _r("ipython.magics", "ipython", "IPython.core.magic", "magics_manager.magics, .registry",
       "write", "removes the magics at %unload_ext", "%unload_ext leaves the magics",
       IPYTHON, p.magics),
    _r("ipython.output_cache", "ipython", "IPython.core.displayhook",
       "displayhook._, __, ___, user_ns_hidden", "write",
       "drops models held by Out[] and _", "models shown as a cell's value stay alive",
       IPYTHON, p.output_cache),
    _r("ipython.transformers", "ipython", "IPython.core.interactiveshell",
       "input_transformers_cleanup, ast_transformers", "write",
       "refuses a cell that does not compile; awaits at top level",
       f"{_FRESH} cells are checked only when they run", IPYTHON, p.transformers),
    _r("ipykernel.shell_parent", "ipykernel", "ipykernel.kernelbase", "Kernel._shell_parent",
       "write", "answers the sidebar while a cell runs",
       "sidebar requests wait for the running cell", IPYKERNEL, p.shell_parent),
    _r("ipykernel.handler_hooks", "ipykernel", "ipykernel.kernelbase",
       "Kernel.pre_handler_hook, post_handler_hook", "write",
       "holds a Ctrl-C that lands in the kernel's code around a cell",
       "a Ctrl-C just before or after a cell is left to ipykernel", IPYKERNEL, p.handler_hooks),
    _r("ipykernel.io_loop", "ipykernel", "ipykernel.kernelbase", "kernel.io_loop", "read",
       "runs the sidebar's Free memory and Scan between cells",
       "the sidebar's Free memory and Scan are off", IPYKERNEL, p.io_loop),
    _r("ipykernel.comm_manager", "ipykernel", "ipykernel.kernelbase",
       "the comm manager's register_target and targets", "write", "opens the sidebar",
       "the sidebar cannot connect", IPYKERNEL, p.comm_manager),
    _r("ipywidgets.handle_msg", "ipywidgets", "ipywidgets.widgets.widget",
       "Widget._handle_msg (overridden)", "write",
       "drops a malformed frontend message quietly",
       "a malformed widget message prints a traceback", "ipywidgets 7.7.1-8.1", p.widget_messages),
    _r("glibc.mallopt", "glibc", "ctypes",
       "mallopt(M_MMAP_THRESHOLD), malloc_trim; Linux prctl in an isolated child", "write",
       "keeps big freed blocks off the heap, so RSS falls when memory is freed",
       "RSS may stay up after memory is freed", "glibc 2.36", p.mallopt),
    _r("cpython.bytecode", "cpython", "dis", "opcodes, exception tables, tracing", "read",
       "raises again a Ctrl-C a library swallowed or a callback lost",
       "a Ctrl-C a library swallows is left to Python", "CPython 3.11-3.13", p.bytecode),
    _r("cpython.frames", "cpython", "sys", "sys._getframe", "read",
       "finds the frames of the running cell and of kerasmagic's own code",
       "a Ctrl-C a library swallows is left to Python", "CPython 3.11-3.13", p.frames),
    _r("cpython.signal", "cpython", "_signal", "the _signal module's signal()", "write",
       "holds a Ctrl-C while kerasmagic works, without Python's signal wrappers",
       "a Ctrl-C during kerasmagic's cleanup is not held", "CPython 3.11-3.13", p.signal_module),
    _r("cpython.module_spec", "cpython", "importlib", "ModuleSpec._initializing", "read",
       "waits for a framework to finish importing before reading it",
       "a framework still importing may be read too early", "CPython 3.11-3.13",
       p.module_spec),
    _r("cpython.referrers", "cpython", "gc", "gc.get_referrers, gc.get_objects", "read",
       "names what holds a model (%gpu_mem --deep, the sidebar's Scan)",
       "%gpu_mem --deep cannot say what holds a model", "CPython 3.11-3.13", p.referrers),
)
# fmt: on

_BY_NAME: dict[str, Reach] = {reach.name: reach for reach in REACHES}

# Each private name of another library the code uses -> the reach whose feature uses it
# (tests/test_registry.py parses the package and fails on a private name not listed here).
PRIVATE_NAMES: dict[str, str] = {
    "_registry": "tf.gradient_registry",
    "_context_handle": "tf.context",
    "_default_graph_stack": "tf.modes",
    "_thread_local_data": "tf.modes",
    "_rng": "tf.op_seeds",
    "_concrete_variable_creation_fn": "tf.function_traces",
    "_created_variables": "tf.function_traces",
    "_dispatch_dict": "tf.function_traces",
    "_function_cache": "tf.function_traces",
    "_no_variable_creation_config": "tf.function_traces",
    "_primary": "tf.function_traces",
    "_variable_creation_config": "tf.function_traces",
    "_weak_variables": "tf.function_traces",
    "_initialize": "tf.first_call_initializers",
    "_create_c_op": "tf.stack_capture",
    "_source_filter_stacks": "tf.stack_capture",
    "_source_mapper_stacks": "tf.stack_capture",
    "_tf_stack": "tf.stack_capture",
    "_functions": "tf.traced_graphs",
    "_list_all_concrete_functions": "tf.traced_graphs",
    "_value": "keras.variables",
    "_flatten_layers": "keras.flatten_layers",
    "_inbound_nodes": "keras.outbound_nodes",
    "_outbound_nodes": "keras.outbound_nodes",
    "_keras_history": "keras.keras_history",
    "_model": "keras.callback_model",
    "_functional": "keras.sequential_inner",
    "_maybe_rebuild": "keras.sequential_inner",
    "_outbound_nodes_value": "tf_keras.outbound_nodes",
    "_BaseOptimizer": "tf_keras.optimizer_build",
    "_cached_compilation": "jax.compiled",
    "_filename_map": "ipython.cell_names",
    "_shell_parent": "ipykernel.shell_parent",
    "ctypes": "glibc.mallopt",
    "_parse_exception_table": "cpython.bytecode",
    "_getframe": "cpython.frames",
    "_signal": "cpython.signal",
    "_initializing": "cpython.module_spec",
    "_bootstrap": "cpython.module_spec",
    "_load_unlocked": "cpython.module_spec",
    "gc.get_referrers": "cpython.referrers",
    "gc.get_objects": "cpython.referrers",
}
