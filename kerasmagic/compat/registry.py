"""The one list of the private structures kerasmagic reaches, each with its cheap probe.

A probe reads the structure as kerasmagic does, from ``sys.modules`` (the module is imported
when it runs), and returns None when it looks as expected, else what differs in a few words
("moved global_state.get_global_attribute"). Probes never create framework objects that users
can see (a layer would take a name from Keras's counter): they read classes, signatures and the
attribute names a function's code sets. ``verified`` is what CI's venvs check
(``tests/test_reaches.py`` on every TensorFlow/Keras pair, docs/testing.md).
"""

from __future__ import annotations

import contextvars
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

from kerasmagic.compat.reaches import Reach

TF = "tensorflow 2.16-2.21"
KERAS = "keras 3.3-3.15"
TF_KERAS = "tf-keras 2.21"
IPYTHON = "IPython 7.34-9.x"
IPYKERNEL = "ipykernel 6.17-7.x"
OPS = "tensorflow.python.framework.ops"
CONTEXT = "tensorflow.python.eager.context"
FUNCTION = "tensorflow.python.eager.polymorphic_function.polymorphic_function"
CACHE = "tensorflow.core.function.polymorphism.function_cache"
STACK = "tensorflow.python.util.tf_stack"
STATE = "keras.src.backend.common.global_state"


def _module(name: str) -> Any:
    return sys.modules[name]


def _sets(function: Any, *names: str) -> str | None:
    """Return None if ``function``'s code (unwrapped) names every one of ``names``."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    found = set(code.co_names) if code is not None else set()
    missing = [n for n in names if n not in found]
    return None if not missing else f"no longer sets {', '.join(missing)}"


def _has(obj: Any, path: str, *names: str, call: bool = False) -> str | None:
    """Return None if ``obj`` has every attribute in ``names`` (callable, with ``call``)."""
    for name in names:
        value = getattr(obj, name, None)
        if value is None or (call and not callable(value)):
            return f"moved {path}.{name}"
    return None


def _params(function: Any, path: str, *names: str) -> str | None:
    try:
        found = set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return f"changed {path}'s signature"
    missing = [n for n in names if n not in found]
    return None if not missing else f"changed {path}'s arguments (no {', '.join(missing)})"


def _first(*checks: Callable[[], str | None]) -> str | None:
    """Return the first check's finding that is not None (each runs only if the ones before
    passed, so a later one may rely on what an earlier one found)."""
    for check in checks:
        found = check()
        if found is not None:
            return found
    return None


# -- TensorFlow --------------------------------------------------------------------------------
def _gradient_registry(_: Any) -> str | None:
    registry = getattr(getattr(_module(OPS), "gradient_registry", None), "_registry", None)
    if not isinstance(registry, dict):
        return "moved ops.gradient_registry._registry"
    if any(type(key) is not str for key in list(registry)):
        return "keys ops.gradient_registry._registry by something else than names"
    return None


def _graph_class(_: Any) -> str | None:
    graph = getattr(_module(OPS), "Graph", None)
    if not isinstance(graph, type) or "__slots__" in vars(graph):
        return "changed ops.Graph (no attributes of its own)"
    return None


def _context(_: Any) -> str | None:
    context = _module(CONTEXT).context()
    return _first(
        lambda: _has(context, "context()", "list_function_names", "list_logical_devices"),
        lambda: None if hasattr(context, "_context_handle") else "moved context()._context_handle",
    )


def _modes(_: Any) -> str | None:
    context = _module(CONTEXT).context()
    stack = getattr(getattr(context, "context_switches", None), "stack", None)
    graphs = getattr(getattr(_module(OPS), "_default_graph_stack", None), "stack", None)
    if not isinstance(stack, list) or not isinstance(graphs, list):
        return "moved context().context_switches.stack or ops._default_graph_stack"
    local = getattr(context, "_thread_local_data", None)
    return None if hasattr(local, "is_eager") else "moved context()._thread_local_data.is_eager"


def _traces(_: Any) -> str | None:
    function: Any = getattr(_module(FUNCTION), "Function", None)
    cache: Any = getattr(sys.modules.get(CACHE), "FunctionCache", None)
    if not isinstance(function, type) or not isinstance(cache, type):
        return "moved Function or FunctionCache"
    return _first(
        lambda: _has(function, "Function", "_list_all_concrete_functions", call=True),
        lambda: _sets(vars(function).get("__init__"), "_variable_creation_config", "_lock"),
        lambda: _params(
            getattr(cache, "delete", None), "FunctionCache.delete", "function_type", "context"
        ),
        lambda: _sets(vars(cache).get("__init__"), "_primary"),
    )


def _first_call(_: Any) -> str | None:
    function = _module(FUNCTION).Function
    code = inspect.unwrap(function._initialize).__code__
    return None if "add_initializers_to" in code.co_cellvars else "moved add_initializers_to"


def _stack(_: Any) -> str | None:
    tf_stack = _module(STACK)
    native = getattr(tf_stack, "_tf_stack", None)
    return _first(
        lambda: _has(tf_stack, "tf_stack", "extract_stack", "_source_mapper_stacks"),
        lambda: _has(tf_stack, "tf_stack", "_source_filter_stacks"),
        lambda: _has(native, "_tf_stack", "LoadTracesFromDebugInfo", call=True),
        lambda: _sets(_module(OPS)._create_c_op, "tf_stack", "extract_stack"),
    )


def _debug_info(_: Any) -> str | None:
    from kerasmagic.backends.tensorflow.tracetree import encode_frames

    frames = [("a.py", 3, "f"), ("b/é.py", 70_000, "g"), ("a.py", 1, "<module>")]
    load = _module(STACK)._tf_stack.LoadTracesFromDebugInfo
    read = [(f.filename, f.lineno, f.name) for f in load(encode_frames(frames))["t"][:]]
    return None if read == frames else "reads GraphDebugInfo bytes differently"


def _traced_graphs(_: Any) -> str | None:
    function = _module(FUNCTION).Function
    return _has(function, "Function", "_list_all_concrete_functions", call=True)


# -- Keras 3 -----------------------------------------------------------------------------------
def _global_state(_: Any) -> str | None:
    state = _module(STATE)
    return _first(
        lambda: _has(state, "global_state", "get_global_attribute", "set_global_attribute"),
        lambda: _params(state.get_global_attribute, "get_global_attribute", "name", "default"),
    )


def _name_uids(_: Any) -> str | None:
    uids = _module(STATE).get_global_attribute("object_name_uids")
    if uids is None or isinstance(uids, Mapping):
        return None
    return "keeps object_name_uids as something else than a mapping"


def _flatten(_: Any) -> str | None:
    layer = getattr(_module("keras.src.layers.layer"), "Layer", None)
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is None:
        return "moved Layer._flatten_layers"
    return _params(flatten, "Layer._flatten_layers", "include_self", "recursive")


def _outbound(_: Any) -> str | None:
    operation = _module("keras.src.ops.operation").Operation
    node = getattr(sys.modules.get("keras.src.ops.node"), "Node", None)
    return _first(
        lambda: _sets(operation.__init__, "_outbound_nodes", "_inbound_nodes"),
        lambda: _sets(node.__init__, "operation") if node else "moved ops.node.Node",
    )


def _history(_: Any) -> str | None:
    node = _module("keras.src.ops.node")
    fields = getattr(getattr(node, "KerasHistory", None), "_fields", ())
    if tuple(fields[:2]) != ("operation", "node_index"):
        return "changed KerasHistory"
    return _sets(node.Node.__init__, "_keras_history")


def _callback(_: Any) -> str | None:
    callback = _module("keras.src.callbacks.callback").Callback()
    marker = object()
    callback.set_model(marker)
    return None if vars(callback).get("_model") is marker else "moved Callback._model"


def _optimizer_build(_: Any) -> str | None:
    base = getattr(_module("keras.src.optimizers.base_optimizer"), "BaseOptimizer", None)
    return None if "build" in vars(base or object) else "moved BaseOptimizer.build"


def _variables(_: Any) -> str | None:
    variables = _module("keras.src.backend.common.variables")
    if any(isinstance(getattr(variables, n, None), type) for n in ("Variable", "KerasVariable")):
        return None
    return "moved backend.common.variables.Variable"


def _backend_name(_: Any) -> str | None:
    return _has(_module("keras.src.backend.config"), "backend.config", "backend", call=True)


def _sequential(_: Any) -> str | None:
    sequential = _module("keras.src.models.sequential").Sequential
    return _sets(getattr(sequential, "_maybe_rebuild", None), "_functional")


def _trainer(_: Any) -> str | None:
    """On a backend that cannot train (Keras's numpy) there is no train function to check."""
    make = getattr(_module("keras.src.models.model").Model, "make_train_function", None)
    return None if make is None else _params(make, "Model.make_train_function", "force")


# -- legacy tf-keras ---------------------------------------------------------------------------
def _tf_keras_uids(_: Any) -> str | None:
    uids = getattr(_module("tf_keras.src.backend"), "PER_GRAPH_OBJECT_NAME_UIDS", None)
    return None if isinstance(uids, Mapping) else "moved backend.PER_GRAPH_OBJECT_NAME_UIDS"


def _tf_keras_outbound(_: Any) -> str | None:
    layer = _module("tf_keras.src.engine.base_layer").Layer
    if not isinstance(vars(layer).get("_outbound_nodes"), property):
        return "moved Layer._outbound_nodes"
    return _sets(layer.__init__, "_outbound_nodes_value")


def _tf_keras_build(_: Any) -> str | None:
    base = getattr(_module("tf_keras.src.optimizers.optimizer"), "_BaseOptimizer", None)
    return None if "build" in vars(base or object) else "moved _BaseOptimizer.build"


# -- JAX and PyTorch ---------------------------------------------------------------------------
def _jax_started(_: Any) -> str | None:
    return _has(_module("jax._src.xla_bridge"), "xla_bridge", "backends_are_initialized")


def _jax_compiled(_: Any) -> str | None:
    cached = getattr(_module("jax._src.interpreters.pxla"), "_cached_compilation", None)
    return _has(cached, "pxla._cached_compilation", "cache_info", call=True)


def _dynamo(_: Any) -> str | None:
    return _has(_module("torch._dynamo"), "torch._dynamo", "reset", call=True)


# -- IPython and ipykernel (probed against the shell kerasmagic loads into) --------------------
def _compiler(shell: Any) -> str | None:
    return _has(shell.compile, "compile", "cache", "extra_flags", "ast_parse", call=True)


def _cell_names(shell: Any) -> str | None:
    """IPython 8 names a cell ``Cell In[N]`` through this map; IPython 7 writes N into the
    file name itself and has none."""
    if isinstance(getattr(shell.compile, "_filename_map", None), dict):
        return None
    old = _module("IPython").version_info < (8,)
    return None if old else "moved compile._filename_map"


def _render_hook(shell: Any) -> str | None:
    """IPython shows an exception whose ``_render_traceback_`` it finds as that method says."""
    showtraceback = inspect.unwrap(type(shell).showtraceback)
    code = getattr(showtraceback, "__code__", None)
    names = set(code.co_names) if code is not None else set()
    return None if "_render_traceback_" in names else "no longer calls _render_traceback_"


def _run_code(shell: Any) -> str | None:
    code = getattr(getattr(type(shell), "run_code", None), "__code__", None)
    return None if code is not None else "moved InteractiveShell.run_code"


def _traceback(shell: Any) -> str | None:
    """``InteractiveTB.tb`` exists once the debugger ran (ultratb sets it then): cleared when
    there, so only the formatter is checked."""
    return _has(shell.InteractiveTB, "InteractiveTB", "structured_traceback", call=True)


def _events(shell: Any) -> str | None:
    callbacks = getattr(shell.events, "callbacks", None)
    if isinstance(callbacks, dict) and isinstance(callbacks.get("post_execute"), list):
        return None
    return "moved events.callbacks"


def _magics(shell: Any) -> str | None:
    manager = shell.magics_manager
    ok = isinstance(getattr(manager, "magics", None), dict) and isinstance(
        getattr(manager, "registry", None), dict
    )
    return None if ok else "moved magics_manager.magics or .registry"


def _output_cache(shell: Any) -> str | None:
    hook = shell.displayhook
    if all(hasattr(hook, n) for n in ("_", "__", "___")) and isinstance(shell.user_ns_hidden, dict):
        return None
    return "moved displayhook._, __, ___ or user_ns_hidden"


def _transformers(shell: Any) -> str | None:
    lists = (shell.input_transformers_cleanup, shell.ast_transformers)
    return None if all(isinstance(x, list) for x in lists) else "moved its transformer lists"


def _shell_parent(shell: Any) -> str | None:
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "shell_channel_thread"):
        return None  # no kernel, or one without subshells (ipykernel 6): nothing to keep apart
    parent = getattr(kernel, "_shell_parent", None)
    return None if isinstance(parent, contextvars.ContextVar) else "moved Kernel._shell_parent"


def _handler_hooks(shell: Any) -> str | None:
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    base = _module("ipykernel.kernelbase").Kernel
    return _has(base, "Kernel", "pre_handler_hook", "post_handler_hook", call=True)


def _io_loop(shell: Any) -> str | None:
    loop = getattr(getattr(shell, "kernel", None), "io_loop", None)
    if getattr(shell, "kernel", None) is None:
        return None
    return _has(loop, "kernel.io_loop", "add_callback", "call_later", call=True)


def _comm_manager(shell: Any) -> str | None:
    from kerasmagic.views.commmanager import comm_manager

    manager = comm_manager(shell)
    if manager is None:
        return None  # no kernel and no comm package: no frontend to open a sidebar
    return _first(
        lambda: _has(manager, "comm manager", "register_target", "unregister_target", call=True),
        lambda: None if isinstance(getattr(manager, "targets", None), dict) else "moved .targets",
    )


def _widget_messages(_: Any) -> str | None:
    widget = getattr(_module("ipywidgets.widgets.widget"), "Widget", None)
    return _has(widget, "Widget", "_handle_msg", call=True)


# -- CPython and glibc -------------------------------------------------------------------------
def _mallopt(_: Any) -> str | None:
    from kerasmagic.native.heap import _libc

    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return None  # not Linux: nothing to pin, said by %load_ext's own line if asked
    return None if hasattr(libc, "mallopt") else "has no mallopt (not glibc)"


def _bytecode(_: Any) -> str | None:
    from kerasmagic.interrupts.pyversions import unchecked

    return None if unchecked() is None else "is not one its opcode-reading code was checked on"


def _r(name: str, library: str, module: str, structure: str, access: str, feature: str,
       consequence: str, verified: str, probe: Callable[[Any], str | None],
       own_line: bool = False) -> Reach:  # fmt: skip
    return Reach(
        name, library, module, structure, access, feature, consequence, verified, probe, own_line
    )


_FRESH = "%%fresh_model"
# fmt: off
# (name, library, module, structure, access, feature, consequence when off, verified, probe)
REACHES: tuple[Reach, ...] = (
    _r("tf.gradient_registry", "tensorflow", OPS, "ops.gradient_registry._registry", "write",
       "releases fitted models' training graphs (the gradient-registry purge)",
       f"fitted models' training graphs stay in TensorFlow's memory after {_FRESH}", TF,
       _gradient_registry),
    _r("tf.graph_attributes", "tensorflow", OPS, "attributes set on ops.Graph objects", "write",
       "parks a graph's registry entries while it collects",
       f"fitted models' training graphs stay in TensorFlow's memory after {_FRESH}", TF,
       _graph_class),
    _r("tf.context", "tensorflow", CONTEXT, "context()._context_handle, list_function_names",
       "read", "reads TensorFlow's allocator figures and its function count",
       "TensorFlow's allocator figures are not shown", TF, _context),
    _r("tf.modes", "tensorflow", CONTEXT,
       "context().context_switches.stack, _thread_local_data.is_eager", "write",
       "puts TensorFlow back in eager mode after a Ctrl-C mid-trace",
       "eager mode is not restored after a Ctrl-C stops a trace", TF, _modes),
    _r("tf.function_traces", "tensorflow", FUNCTION,
       "Function._variable_creation_config, FunctionCache._primary and delete()", "write",
       "clears the traces a tf.function from an earlier cell keeps of dropped models",
       "a tf.function from an earlier cell keeps every model it traced", TF, _traces),
    _r("tf.first_call_initializers", "tensorflow", FUNCTION,
       "the add_initializers_to list of Function._initialize", "write",
       "frees the variables a tf.function created on its first call",
       "a tf.function that built its optimizer keeps that optimizer's first model", TF,
       _first_call),
    _r("tf.stack_capture", "tensorflow", STACK,
       "tf_stack.extract_stack (replaced), _source_mapper_stacks, _tf_stack", "write",
       "records op stack traces as strings", "op stack traces are TensorFlow's own (each "
       "re-run of a cell that fits keeps ~0.5 MB)", TF, _stack),
    _r("tf.debug_info", "tensorflow", STACK,
       "GraphDebugInfo bytes read by _tf_stack.LoadTracesFromDebugInfo", "write",
       "records op stack traces as strings", "op stack traces are TensorFlow's own (each "
       "re-run of a cell that fits keeps ~0.5 MB)", TF, _debug_info),
    _r("tf.traced_graphs", "tensorflow", FUNCTION, "Function._list_all_concrete_functions",
       "read", "counts the ops a model's traced functions hold (%gpu_mem --deep)",
       "traced ops show as unknown in %gpu_mem --deep", TF, _traced_graphs),
    _r("keras.global_state", "keras", STATE, "global_state.get/set_global_attribute", "write",
       "keeps Keras settings across clear_session()",
       f"mixed-precision policy and random seed are not kept across {_FRESH}", KERAS,
       _global_state),
    _r("keras.name_uids", "keras", STATE, "global_state 'object_name_uids'", "read",
       "counts auto-named layers", "the layer-name counter is not shown", KERAS, _name_uids),
    _r("keras.variables", "keras", "keras.src.backend.common.variables",
       "backend.common.variables.Variable", "read", "counts Keras variables as model state",
       f"loose Keras variables are not dropped by {_FRESH}", KERAS, _variables),
    _r("keras.flatten_layers", "keras", "keras.src.layers.layer", "Layer._flatten_layers",
       "read", "knows what a kept model owns",
       f"{_FRESH} may name layers of kept models as dropped", KERAS, _flatten),
    _r("keras.outbound_nodes", "keras", "keras.src.ops.operation",
       "Operation._outbound_nodes, Node.operation", "write",
       "unlinks dropped heads from the graphs of kept base models",
       "dropped heads stay linked to kept base models (their weights stay)", KERAS, _outbound),
    _r("keras.keras_history", "keras", "keras.src.ops.node", "KerasTensor._keras_history",
       "read", "keeps the symbolic tensors of kept models",
       f"{_FRESH} cannot tell which symbolic tensors kept models use", KERAS, _history),
    _r("keras.callback_model", "keras", "keras.src.callbacks.callback", "Callback._model",
       "write", "cuts History.model, so an old model goes while its numbers stay",
       "history.model keeps old models alive", KERAS, _callback),
    _r("keras.optimizer_build", "keras", "keras.src.optimizers.base_optimizer",
       "BaseOptimizer.build (wrapped)", "write", "frees between the models of one loop",
       "a loop in one cell keeps every model it trains", KERAS, _optimizer_build),
    _r("keras.backend_name", "keras", "keras.src.backend.config", "backend.config.backend()",
       "read", "tells which backend Keras runs on",
       "the Keras backend is guessed from what is imported", KERAS, _backend_name),
    _r("keras.sequential_inner", "keras", "keras.src.models.sequential",
       "Sequential._functional", "read", "counts a Sequential once, not with its inner model",
       "a Sequential is listed twice in %gpu_mem --deep", KERAS, _sequential),
    _r("keras.train_function", "keras", "keras.src.models.model",
       "Model.make_train_function(force=)", "write",
       "find_batch_size leaves the model as it came", "find_batch_size is off", KERAS, _trainer),
    _r("tf_keras.name_uids", "tf-keras", "tf_keras.src.backend",
       "backend.PER_GRAPH_OBJECT_NAME_UIDS", "read", "counts auto-named layers (tf-keras)",
       "the layer-name counter is not shown", TF_KERAS, _tf_keras_uids),
    _r("tf_keras.outbound_nodes", "tf-keras", "tf_keras.src.engine.base_layer",
       "Layer._outbound_nodes_value", "write", "unlinks dropped heads from kept base models",
       "dropped heads stay linked to kept base models (their weights stay)", TF_KERAS,
       _tf_keras_outbound),
    _r("tf_keras.optimizer_build", "tf-keras", "tf_keras.src.optimizers.optimizer",
       "_BaseOptimizer.build (wrapped)", "write", "frees between the models of one loop",
       "a loop in one cell keeps every model it trains", TF_KERAS, _tf_keras_build),
    _r("jax.started", "jax", "jax._src.xla_bridge", "xla_bridge.backends_are_initialized",
       "read", "tells whether JAX has started its devices",
       "JAX's figures are shown only once Keras runs on it", "jax 0.4.30-0.10", _jax_started),
    _r("jax.compiled", "jax", "jax._src.interpreters.pxla", "pxla._cached_compilation",
       "read", "counts JAX's compiled functions", "JAX's compiled-function count is not shown",
       "jax 0.4.30-0.10", _jax_compiled),
    _r("torch.dynamo", "torch", "torch._dynamo", "torch._dynamo.reset", "write",
       "empties torch.compile's caches", f"torch.compile's caches are kept by {_FRESH}",
       "torch 2.4-2.13", _dynamo),
    _r("ipython.compiler", "ipython", "IPython.core.compilerop",
       "compile.cache/extra_flags/ast_parse", "read",
       "compiles a %%fresh_model cell as a plain cell", f"{_FRESH} is off", IPYTHON, _compiler),
    _r("ipython.cell_names", "ipython", "IPython.core.compilerop", "compile._filename_map",
       "write", "names a re-run %%fresh_model cell's code In[N] in tracebacks",
       f"a re-run {_FRESH} cell's traceback names the In[N] of its first run", IPYTHON,
       _cell_names),
    _r("ipython.render_hook", "ipython", "IPython.core.interactiveshell",
       "showtraceback's call of _render_traceback_", "read",
       "shows a %%fresh_model cell's error from the cell's own line",
       "a %%fresh_model cell's error shows IPython's and kerasmagic's frames", IPYTHON,
       _render_hook),
    _r("ipython.run_code", "ipython", "IPython.core.interactiveshell",
       "InteractiveShell.run_code's code", "read", "finds where a cell starts in a stack",
       "stored tracebacks and op stack traces reach above the cell", IPYTHON, _run_code),
    _r("ipython.traceback", "ipython", "IPython.core.ultratb",
       "InteractiveTB.structured_traceback (and .tb, once set)", "write",
       "drops a stored error's frames; shows errors from the cell's line",
       "a stored error keeps its models", IPYTHON, _traceback),
    _r("ipython.events", "ipython", "IPython.core.events", "events.callbacks['post_execute']",
       "write", "holds Ctrl-C from the cell's last line on",
       "a Ctrl-C just after a cell may be lost", IPYTHON, _events),
    _r("ipython.magics", "ipython", "IPython.core.magic", "magics_manager.magics, .registry",
       "write", "removes the magics at %unload_ext", "%unload_ext leaves the magics",
       IPYTHON, _magics),
    _r("ipython.output_cache", "ipython", "IPython.core.displayhook",
       "displayhook._, __, ___, user_ns_hidden", "write",
       "drops models held by Out[] and _", "models shown as a cell's value stay alive",
       IPYTHON, _output_cache),
    _r("ipython.transformers", "ipython", "IPython.core.interactiveshell",
       "input_transformers_cleanup, ast_transformers", "write",
       "refuses a cell that does not compile; awaits at top level",
       f"{_FRESH} cells are checked only when they run", IPYTHON, _transformers),
    _r("ipykernel.shell_parent", "ipykernel", "ipykernel.kernelbase", "Kernel._shell_parent",
       "write", "answers the sidebar while a cell runs",
       "sidebar requests wait for the running cell", IPYKERNEL, _shell_parent),
    _r("ipykernel.handler_hooks", "ipykernel", "ipykernel.kernelbase",
       "Kernel.pre_handler_hook, post_handler_hook", "write",
       "holds a Ctrl-C that lands in the kernel's code around a cell",
       "a Ctrl-C just before or after a cell is left to ipykernel", IPYKERNEL, _handler_hooks),
    _r("ipykernel.io_loop", "ipykernel", "ipykernel.kernelbase", "kernel.io_loop", "read",
       "runs the sidebar's Free memory and Scan between cells",
       "the sidebar's Free memory and Scan are off", IPYKERNEL, _io_loop),
    _r("ipykernel.comm_manager", "ipykernel", "ipykernel.kernelbase",
       "the comm manager's register_target and targets", "write", "opens the sidebar",
       "the sidebar cannot connect", IPYKERNEL, _comm_manager),
    _r("ipywidgets.handle_msg", "ipywidgets", "ipywidgets.widgets.widget",
       "Widget._handle_msg (overridden)", "write",
       "drops a malformed frontend message quietly",
       "a malformed widget message prints a traceback", "ipywidgets 7.7.1-8.1", _widget_messages),
    _r("glibc.mallopt", "glibc", "ctypes", "mallopt(M_MMAP_THRESHOLD)", "write",
       "keeps big freed blocks off the heap, so RSS falls when memory is freed",
       "RSS may stay up after memory is freed", "glibc 2.36", _mallopt),
    _r("cpython.bytecode", "cpython", "dis", "opcodes, exception tables, tracing", "read",
       "raises again a Ctrl-C a library swallowed or a callback lost",
       "a Ctrl-C a library swallows is left to Python", "CPython 3.11-3.13", _bytecode,
       own_line=True),
)
# fmt: on
