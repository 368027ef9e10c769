"""The probes of the frameworks' private structures (TensorFlow, Keras, tf-keras, JAX,
PyTorch): each reads what kerasmagic reads, from ``sys.modules``, never creating an object a
user sees; None when it looks as expected, else what differs (``compat/registry.py``)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from typing import Any

from kerasmagic.compat.probe_util import first, has, module, params, sets

OPS = "tensorflow.python.framework.ops"
CONTEXT = "tensorflow.python.eager.context"
FUNCTION = "tensorflow.python.eager.polymorphic_function.polymorphic_function"
CACHE = "tensorflow.core.function.polymorphism.function_cache"
STACK = "tensorflow.python.util.tf_stack"
STATE = "keras.src.backend.common.global_state"


# -- TensorFlow --------------------------------------------------------------------------------
def gradient_registry(_: Any) -> str | None:
    registry = getattr(getattr(module(OPS), "gradient_registry", None), "_registry", None)
    if not isinstance(registry, dict):
        return "moved ops.gradient_registry._registry"
    if any(type(key) is not str for key in list(registry)):
        return "keys ops.gradient_registry._registry by something else than names"
    return None


def graph_class(_: Any) -> str | None:
    graph = getattr(module(OPS), "Graph", None)
    if not isinstance(graph, type) or "__slots__" in vars(graph):
        return "changed ops.Graph (no attributes of its own)"
    return None


def context(_: Any) -> str | None:
    context = module(CONTEXT).context()
    return first(
        lambda: has(context, "context()", "list_function_names", "list_logical_devices"),
        lambda: None if hasattr(context, "_context_handle") else "moved context()._context_handle",
    )


def modes(_: Any) -> str | None:
    context = module(CONTEXT).context()
    stack = getattr(getattr(context, "context_switches", None), "stack", None)
    graphs = getattr(getattr(module(OPS), "_default_graph_stack", None), "stack", None)
    if not isinstance(stack, list) or not isinstance(graphs, list):
        return "moved context().context_switches.stack or ops._default_graph_stack"
    local = getattr(context, "_thread_local_data", None)
    return None if hasattr(local, "is_eager") else "moved context()._thread_local_data.is_eager"


def traces(_: Any) -> str | None:
    function: Any = getattr(module(FUNCTION), "Function", None)
    cache: Any = getattr(sys.modules.get(CACHE), "FunctionCache", None)
    if not isinstance(function, type) or not isinstance(cache, type):
        return "moved Function or FunctionCache"
    return first(
        lambda: has(function, "Function", "_list_all_concrete_functions", call=True),
        lambda: sets(vars(function).get("__init__"), "_variable_creation_config", "_lock"),
        lambda: params(
            getattr(cache, "delete", None), "FunctionCache.delete", "function_type", "context"
        ),
        lambda: sets(vars(cache).get("__init__"), "_primary"),
    )


def first_call(_: Any) -> str | None:
    function = module(FUNCTION).Function
    code = inspect.unwrap(function._initialize).__code__
    return None if "add_initializers_to" in code.co_cellvars else "moved add_initializers_to"


def stack(_: Any) -> str | None:
    tf_stack = module(STACK)
    native = getattr(tf_stack, "_tf_stack", None)
    return first(
        lambda: has(tf_stack, "tf_stack", "extract_stack", "_source_mapper_stacks"),
        lambda: has(tf_stack, "tf_stack", "_source_filter_stacks"),
        lambda: has(native, "_tf_stack", "LoadTracesFromDebugInfo", call=True),
        lambda: sets(module(OPS)._create_c_op, "tf_stack", "extract_stack"),
    )


def debug_info(_: Any) -> str | None:
    # The one import of a backend's module outside backends/: this probe checks that module's
    # own hand-encoded bytes against TensorFlow's reader (lazy: backends import compat).
    from kerasmagic.backends.tensorflow.tracetree import encode_frames

    frames = [("a.py", 3, "f"), ("b/é.py", 70_000, "g"), ("a.py", 1, "<module>")]
    load = module(STACK)._tf_stack.LoadTracesFromDebugInfo
    read = [(f.filename, f.lineno, f.name) for f in load(encode_frames(frames))["t"][:]]
    return None if read == frames else "reads GraphDebugInfo bytes differently"


def traced_graphs(_: Any) -> str | None:
    function = module(FUNCTION).Function
    return has(function, "Function", "_list_all_concrete_functions", call=True)


# -- Keras 3 -----------------------------------------------------------------------------------
def global_state(_: Any) -> str | None:
    state = module(STATE)
    return first(
        lambda: has(state, "global_state", "get_global_attribute", "set_global_attribute"),
        lambda: params(state.get_global_attribute, "get_global_attribute", "name", "default"),
    )


def name_uids(_: Any) -> str | None:
    uids = module(STATE).get_global_attribute("object_name_uids")
    if uids is None or isinstance(uids, Mapping):
        return None
    return "keeps object_name_uids as something else than a mapping"


def flatten(_: Any) -> str | None:
    layer = getattr(module("keras.src.layers.layer"), "Layer", None)
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is None:
        return "moved Layer._flatten_layers"
    return params(flatten, "Layer._flatten_layers", "include_self", "recursive")


def outbound(_: Any) -> str | None:
    operation = module("keras.src.ops.operation").Operation
    node = getattr(sys.modules.get("keras.src.ops.node"), "Node", None)
    return first(
        lambda: sets(operation.__init__, "_outbound_nodes", "_inbound_nodes"),
        lambda: sets(node.__init__, "operation") if node else "moved ops.node.Node",
    )


def history(_: Any) -> str | None:
    node = module("keras.src.ops.node")
    fields = getattr(getattr(node, "KerasHistory", None), "_fields", ())
    if tuple(fields[:2]) != ("operation", "node_index"):
        return "changed KerasHistory"
    return sets(node.Node.__init__, "_keras_history")


def callback(_: Any) -> str | None:
    callback = module("keras.src.callbacks.callback").Callback()
    marker = object()
    callback.set_model(marker)
    return None if vars(callback).get("_model") is marker else "moved Callback._model"


def optimizer_build(_: Any) -> str | None:
    base = getattr(module("keras.src.optimizers.base_optimizer"), "BaseOptimizer", None)
    return None if "build" in vars(base or object) else "moved BaseOptimizer.build"


def variables(_: Any) -> str | None:
    variables = module("keras.src.backend.common.variables")
    if any(isinstance(getattr(variables, n, None), type) for n in ("Variable", "KerasVariable")):
        return None
    return "moved backend.common.variables.Variable"


def backend_name(_: Any) -> str | None:
    return has(module("keras.src.backend.config"), "backend.config", "backend", call=True)


def sequential(_: Any) -> str | None:
    sequential = module("keras.src.models.sequential").Sequential
    return sets(getattr(sequential, "_maybe_rebuild", None), "_functional")


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
    return sets(layer.__init__, "_outbound_nodes_value")


def tf_keras_build(_: Any) -> str | None:
    base = getattr(module("tf_keras.src.optimizers.optimizer"), "_BaseOptimizer", None)
    return None if "build" in vars(base or object) else "moved _BaseOptimizer.build"


# -- JAX and PyTorch ---------------------------------------------------------------------------
def jax_started(_: Any) -> str | None:
    return has(module("jax._src.xla_bridge"), "xla_bridge", "backends_are_initialized")


def jax_compiled(_: Any) -> str | None:
    cached = getattr(module("jax._src.interpreters.pxla"), "_cached_compilation", None)
    return has(cached, "pxla._cached_compilation", "cache_info", call=True)


def dynamo(_: Any) -> str | None:
    return has(module("torch._dynamo"), "torch._dynamo", "reset", call=True)
