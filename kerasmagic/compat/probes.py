"""The probes of every private structure in ``registry.REACHES``: each reads what kerasmagic
reads, from ``sys.modules``, never creating an object a user sees, and returns None when it
looks as expected, else what differs in a few words ("moved global_state.get_attribute")."""

from __future__ import annotations

import contextvars
import ctypes
import functools
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

Probe = Callable[[Any], str | None]  # given the shell (or None): None, or what differs


def module(name: str) -> Any:
    """Return the imported module ``name`` (a probe runs once it is imported)."""
    return sys.modules[name]


def uses(function: Any, *names: str) -> str | None:
    """Return None if ``function``'s code (unwrapped) names every one of ``names``."""
    code = getattr(inspect.unwrap(function), "__code__", None)
    missing = [n for n in names if n not in getattr(code, "co_names", ())]
    return f"no longer uses {', '.join(missing)}" if missing else None


def has(obj: Any, path: str, *names: str, call: bool = False) -> str | None:
    """Return None if ``obj`` has every attribute in ``names`` (callable, with ``call``)."""
    for name in names:
        if (value := getattr(obj, name, None)) is None or (call and not callable(value)):
            return f"moved {path}.{name}"
    return None


def params(function: Any, path: str, *names: str) -> str | None:
    """Return None if ``function`` takes every argument in ``names``."""
    try:
        found = set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return f"changed {path}'s signature"
    missing = [n for n in names if n not in found]
    return f"changed {path}'s arguments (no {', '.join(missing)})" if missing else None


def exposes(where: str | tuple[str, str], path: str, *names: str, call: bool = True) -> Probe:
    """Return a probe that the module ``where`` (or its attribute: ``(module, attribute)``) has
    every attribute in ``names``, callable unless not ``call`` (said as ``path``.name)."""
    name, attribute = (where, "") if isinstance(where, str) else where

    def probe(_: Any) -> str | None:
        found = getattr(module(name), attribute, None) if attribute else module(name)
        return has(found, path, *names, call=call)

    return probe


OPS = "tensorflow.python.framework.ops"
CONTEXT = "tensorflow.python.eager.context"
FUNCTION = "tensorflow.python.eager.polymorphic_function.polymorphic_function"
CACHE = "tensorflow.core.function.polymorphism.function_cache"
STACK = "tensorflow.python.util.tf_stack"
STATE = "keras.src.backend.common.global_state"
PXLA = "jax._src.interpreters.pxla"


# -- TensorFlow --------------------------------------------------------------------------------
def gradient_registry(_: Any) -> str | None:
    registry = getattr(getattr(module(OPS), "gradient_registry", None), "_registry", None)
    if not isinstance(registry, dict):
        return "moved ops.gradient_registry._registry"
    named = all(type(key) is str for key in list(registry))
    return None if named else "keys ops.gradient_registry._registry by something else than names"


def graph_class(_: Any) -> str | None:
    graph = getattr(module(OPS), "Graph", None)
    own = isinstance(graph, type) and "__slots__" not in vars(graph)
    return None if own else "changed ops.Graph (no attributes of its own)"


def context(_: Any) -> str | None:
    context = module(CONTEXT).context()
    found = has(context, "context()", "list_function_names", "list_logical_devices")
    handle = hasattr(context, "_context_handle")
    return found or (None if handle else "moved context()._context_handle")


def op_seeds(_: Any) -> str | None:
    generator = getattr(module(CONTEXT).context(), "_rng", None)
    # None until tf.random.set_seed: nothing to put back
    ok = generator is None or callable(getattr(generator, "getstate", None))
    return None if ok else "moved context()._rng"


def modes(_: Any) -> str | None:
    context = module(CONTEXT).context()
    stack = getattr(getattr(context, "context_switches", None), "stack", None)
    graphs = getattr(getattr(module(OPS), "_default_graph_stack", None), "stack", None)
    if not isinstance(stack, list) or not isinstance(graphs, list):
        return "moved context().context_switches.stack or ops._default_graph_stack"
    local = getattr(context, "_thread_local_data", None)
    return None if hasattr(local, "is_eager") else "moved context()._thread_local_data.is_eager"


FIRST_CALL_STATE = "_created_variables", "_variable_creation_config", "_no_variable_creation_config"


def traces(_: Any) -> str | None:
    function: Any = getattr(module(FUNCTION), "Function", None)
    cache: Any = getattr(sys.modules.get(CACHE), "FunctionCache", None)
    if not isinstance(function, type) or not isinstance(cache, type):
        return "moved Function or FunctionCache"
    delete = getattr(cache, "delete", None)
    return (
        traced_graphs(None)
        or uses(vars(function).get("__init__"), *FIRST_CALL_STATE, "_lock")
        or params(delete, "FunctionCache.delete", "function_type", "context")
        or uses(vars(cache).get("__init__"), "_primary")
    )


def first_call(_: Any) -> str | None:
    code = inspect.unwrap(module(FUNCTION).Function._initialize).__code__
    return None if "add_initializers_to" in code.co_cellvars else "moved add_initializers_to"


def stack(_: Any) -> str | None:
    tf_stack = module(STACK)
    return (
        has(tf_stack, "tf_stack", "extract_stack", "_source_mapper_stacks", "_source_filter_stacks")
        or debug_info(None)
        or uses(module(OPS)._create_c_op, "tf_stack", "extract_stack")
    )


# The bytes themselves are checked where they are made (``stack.install``).
debug_info = exposes((STACK, "_tf_stack"), "_tf_stack", "LoadTracesFromDebugInfo")


def traced_graphs(_: Any) -> str | None:
    return has(module(FUNCTION).Function, "Function", "_list_all_concrete_functions", call=True)


# -- Keras 3 -----------------------------------------------------------------------------------
def global_state(_: Any) -> str | None:
    state = module(STATE)
    found = has(state, "global_state", "get_global_attribute", "set_global_attribute")
    return found or params(state.get_global_attribute, "get_global_attribute", "name", "default")


def name_uids(_: Any) -> str | None:
    uids = module(STATE).get_global_attribute("object_name_uids")
    ok = uids is None or isinstance(uids, Mapping)
    return None if ok else "keeps object_name_uids as something else than a mapping"


def flatten(_: Any) -> str | None:
    layer: Any = getattr(module("keras.src.layers.layer"), "Layer", None)
    if found := has(layer, "Layer", "_flatten_layers"):
        return found
    return params(layer._flatten_layers, "Layer._flatten_layers", "include_self", "recursive")


def outbound(_: Any) -> str | None:
    operation = module("keras.src.ops.operation").Operation
    if (node := getattr(sys.modules.get("keras.src.ops.node"), "Node", None)) is None:
        return "moved ops.node.Node"
    found = uses(operation.__init__, "_outbound_nodes", "_inbound_nodes")
    return found or uses(node.__init__, "operation")


def history(_: Any) -> str | None:
    node = module("keras.src.ops.node")
    fields = getattr(getattr(node, "KerasHistory", None), "_fields", ())
    if tuple(fields[:2]) != ("operation", "node_index"):
        return "changed KerasHistory"
    return uses(node.Node.__init__, "_keras_history")


def callback(_: Any) -> str | None:
    callback = module("keras.src.callbacks.callback").Callback()
    callback.set_model(marker := object())
    return None if vars(callback).get("_model") is marker else "moved Callback._model"


def optimizer_build(_: Any) -> str | None:
    base = getattr(module("keras.src.optimizers.base_optimizer"), "BaseOptimizer", None)
    return None if "build" in vars(base or object) else "moved BaseOptimizer.build"


def variables(_: Any) -> str | None:
    variables = module("keras.src.backend.common.variables")
    ok = any(isinstance(getattr(variables, n, None), type) for n in ("Variable", "KerasVariable"))
    return None if ok else "moved backend.common.variables.Variable"


backend_name = exposes("keras.src.backend.config", "backend.config", "backend")


def sequential(_: Any) -> str | None:
    sequential = module("keras.src.models.sequential").Sequential
    return uses(getattr(sequential, "_maybe_rebuild", None), "_functional")


def trainer(_: Any) -> str | None:
    """On a backend that cannot train (Keras's numpy) there is no train function to check."""
    make = getattr(module("keras.src.models.model").Model, "make_train_function", None)
    return None if make is None else params(make, "Model.make_train_function", "force")


# -- legacy tf-keras ---------------------------------------------------------------------------
def tf_keras_uids(_: Any) -> str | None:
    uids = getattr(module("tf_keras.src.backend"), "PER_GRAPH_OBJECT_NAME_UIDS", None)
    return None if isinstance(uids, Mapping) else "moved backend.PER_GRAPH_OBJECT_NAME_UIDS"


def tf_keras_outbound(_: Any) -> str | None:
    layer = module("tf_keras.src.engine.base_layer").Layer
    if not isinstance(vars(layer).get("_outbound_nodes"), property):
        return "moved Layer._outbound_nodes"
    return uses(layer.__init__, "_outbound_nodes_value")


def tf_keras_build(_: Any) -> str | None:
    base = getattr(module("tf_keras.src.optimizers.optimizer"), "_BaseOptimizer", None)
    return None if "build" in vars(base or object) else "moved _BaseOptimizer.build"


# -- JAX and PyTorch ---------------------------------------------------------------------------
jax_started = exposes("jax._src.xla_bridge", "xla_bridge", "backends_are_initialized", call=False)
jax_compiled = exposes((PXLA, "_cached_compilation"), "pxla._cached_compilation", "cache_info")
dynamo = exposes("torch._dynamo", "torch._dynamo", "reset")


# -- IPython and ipykernel (probed against the shell kerasmagic loads into) --------------------
def compiler(shell: Any) -> str | None:
    return has(shell.compile, "compile", "cache", "extra_flags", "ast_parse", call=True)


def cell_names(shell: Any) -> str | None:
    """IPython 8 names a cell ``Cell In[N]`` through this map; IPython 7 writes N into the
    file name itself and has none."""
    ok = isinstance(getattr(shell.compile, "_filename_map", None), dict)
    return None if ok or module("IPython").version_info < (8,) else "moved compile._filename_map"


def render_hook(shell: Any) -> str | None:
    """IPython shows an exception whose ``_render_traceback_`` it finds as that method says."""
    return uses(type(shell).showtraceback, "_render_traceback_")


def run_code(shell: Any) -> str | None:
    code = getattr(getattr(type(shell), "run_code", None), "__code__", None)
    return None if code is not None else "moved InteractiveShell.run_code"


def traceback(shell: Any) -> str | None:
    """``InteractiveTB.tb`` exists once the debugger ran (ultratb sets it then): cleared when
    there, so only the formatter is checked."""
    return has(shell.InteractiveTB, "InteractiveTB", "structured_traceback", call=True)


def events(shell: Any) -> str | None:
    callbacks = getattr(shell.events, "callbacks", None)
    ok = isinstance(callbacks, dict) and isinstance(callbacks.get("post_execute"), list)
    return None if ok else "moved events.callbacks"


def magics(shell: Any) -> str | None:
    manager = shell.magics_manager
    ok = all(isinstance(getattr(manager, n, None), dict) for n in ("magics", "registry"))
    return None if ok else "moved magics_manager.magics or .registry"


def output_cache(shell: Any) -> str | None:
    copies = all(hasattr(shell.displayhook, n) for n in ("_", "__", "___"))
    ok = copies and isinstance(shell.user_ns_hidden, dict)
    return None if ok else "moved displayhook._, __, ___ or user_ns_hidden"


def transformers(shell: Any) -> str | None:
    lists = (shell.input_transformers_cleanup, shell.ast_transformers)
    return None if all(isinstance(x, list) for x in lists) else "moved its transformer lists"


def shell_parent(shell: Any) -> str | None:
    if not hasattr(getattr(shell, "kernel", None), "shell_channel_thread"):
        return None  # no kernel, or one without subshells (ipykernel 6): nothing to keep apart
    parent = getattr(shell.kernel, "_shell_parent", None)
    return None if isinstance(parent, contextvars.ContextVar) else "moved Kernel._shell_parent"


def handler_hooks(shell: Any) -> str | None:
    if getattr(shell, "kernel", None) is None:
        return None
    base = module("ipykernel.kernelbase").Kernel
    return has(base, "Kernel", "pre_handler_hook", "post_handler_hook", call=True)


def io_loop(shell: Any) -> str | None:
    if (kernel := getattr(shell, "kernel", None)) is None:
        return None
    loop = getattr(kernel, "io_loop", None)
    return has(loop, "kernel.io_loop", "add_callback", "call_later", call=True)


def comm_manager(shell: Any) -> str | None:
    if (manager := find_comm_manager(shell)) is None:
        return None  # no kernel and no comm package: no frontend to open a sidebar
    if not isinstance(getattr(manager, "targets", None), dict):
        return "moved .targets"
    return has(manager, "comm manager", "register_target", "unregister_target", call=True)


widget_messages = exposes(("ipywidgets.widgets.widget", "Widget"), "Widget", "_handle_msg")


# -- CPython and glibc -------------------------------------------------------------------------
def mallopt(_: Any) -> str | None:
    libc = find_libc()  # None where not Linux: nothing to pin
    return None if libc is None or hasattr(libc, "mallopt") else "has no mallopt (not glibc)"


# The opcodes themselves are checked by version where they are read (``interrupts``).
bytecode = exposes("dis", "dis", "_parse_exception_table", "get_instructions")
frames = exposes("sys", "sys", "_getframe")
signal_module = exposes("_signal", "_signal", "signal", "default_int_handler")


def module_spec(_: Any) -> str | None:
    bootstrap = getattr(module("importlib"), "_bootstrap", None)
    return uses(getattr(bootstrap, "_load_unlocked", None), "_initializing")


referrers = exposes("gc", "gc", "get_referrers", "get_objects")


# -- the registry's accessors of what the probes above check -----------------------------------
@functools.cache
def find_libc() -> ctypes.CDLL | None:
    """Return the C library this process runs on (Linux), once (reach ``glibc.mallopt``)."""
    try:  # the process's own symbols: libc's malloc is among them
        return ctypes.CDLL(None) if sys.platform.startswith("linux") else None
    except OSError:
        return None


def find_comm_manager(shell: Any) -> Any | None:
    """Return the comm manager of ``shell``'s kernel, else the ``comm`` package's, else None.

    ipykernel >= 6.18 hands its manager to the ``comm`` package, so ``comm.get_comm_manager()``
    is the kernel's. ipykernel 6.17 (Colab's and Kaggle's) predates that package: its manager is
    ``kernel.comm_manager``, and on Kaggle, where ``comm`` is installed beside it, the package's
    manager is a stand-in that no frontend message ever reaches. So the kernel's own manager
    comes first; the ``comm`` package's serves a shell without a kernel (tests, a terminal).
    """
    if (manager := getattr(getattr(shell, "kernel", None), "comm_manager", None)) is not None:
        return manager
    try:
        import comm
    except ImportError:  # ipykernel 6.17 without the comm package, and no kernel: no comms
        return None
    return comm.get_comm_manager()
