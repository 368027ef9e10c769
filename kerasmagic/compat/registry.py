"""The one list of the private structures kerasmagic reaches, each with its cheap probe.

A probe (``probe_frameworks.py``, ``probe_jupyter.py``) reads the structure as kerasmagic does,
from ``sys.modules`` (the module is imported when it runs), and returns None when it looks as
expected, else what differs in a few words ("moved global_state.get_global_attribute"). Probes
never create framework objects that users can see (a layer would take a name from Keras's
counter): they read classes, signatures and the attribute names a function's code sets.
``verified`` is what CI's venvs check (``tests/test_reaches.py`` on every TensorFlow/Keras
pair, docs/testing.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kerasmagic.compat import probe_frameworks as fw
from kerasmagic.compat import probe_jupyter as jp
from kerasmagic.compat.probe_frameworks import CONTEXT, FUNCTION, OPS, STACK, STATE
from kerasmagic.compat.reaches import Reach

TF = "tensorflow 2.16-2.21"
KERAS = "keras 3.3-3.15"
TF_KERAS = "tf-keras 2.21"
IPYTHON = "IPython 7.34-9.x"
IPYKERNEL = "ipykernel 6.17-7.x"


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
       fw.gradient_registry),
    _r("tf.graph_attributes", "tensorflow", OPS, "attributes set on ops.Graph objects", "write",
       "parks a graph's registry entries while it collects",
       f"fitted models' training graphs stay in TensorFlow's memory after {_FRESH}", TF,
       fw.graph_class),
    _r("tf.context", "tensorflow", CONTEXT, "context()._context_handle, list_function_names",
       "read", "reads TensorFlow's allocator figures and its function count",
       "TensorFlow's allocator figures are not shown", TF, fw.context),
    _r("tf.modes", "tensorflow", CONTEXT,
       "context().context_switches.stack, _thread_local_data.is_eager", "write",
       "puts TensorFlow back in eager mode after a Ctrl-C mid-trace",
       "eager mode is not restored after a Ctrl-C stops a trace", TF, fw.modes),
    _r("tf.function_traces", "tensorflow", FUNCTION,
       "Function._variable_creation_config, FunctionCache._primary and delete()", "write",
       "clears the traces a tf.function from an earlier cell keeps of dropped models",
       "a tf.function from an earlier cell keeps every model it traced", TF, fw.traces),
    _r("tf.first_call_initializers", "tensorflow", FUNCTION,
       "the add_initializers_to list of Function._initialize", "write",
       "frees the variables a tf.function created on its first call",
       "a tf.function that built its optimizer keeps that optimizer's first model", TF,
       fw.first_call),
    _r("tf.stack_capture", "tensorflow", STACK,
       "tf_stack.extract_stack (replaced), _source_mapper_stacks, _tf_stack", "write",
       "records op stack traces as strings", "op stack traces are TensorFlow's own (each "
       "re-run of a cell that fits keeps ~0.5 MB)", TF, fw.stack),
    _r("tf.debug_info", "tensorflow", STACK,
       "GraphDebugInfo bytes read by _tf_stack.LoadTracesFromDebugInfo", "write",
       "records op stack traces as strings", "op stack traces are TensorFlow's own (each "
       "re-run of a cell that fits keeps ~0.5 MB)", TF, fw.debug_info),
    _r("tf.traced_graphs", "tensorflow", FUNCTION, "Function._list_all_concrete_functions",
       "read", "counts the ops a model's traced functions hold (%gpu_mem --deep)",
       "traced ops show as unknown in %gpu_mem --deep", TF, fw.traced_graphs),
    _r("keras.global_state", "keras", STATE, "global_state.get/set_global_attribute", "write",
       "keeps Keras settings across clear_session()",
       f"mixed-precision policy and random seed are not kept across {_FRESH}", KERAS,
       fw.global_state),
    _r("keras.name_uids", "keras", STATE, "global_state 'object_name_uids'", "read",
       "counts auto-named layers", "the layer-name counter is not shown", KERAS, fw.name_uids),
    _r("keras.variables", "keras", "keras.src.backend.common.variables",
       "backend.common.variables.Variable", "read", "counts Keras variables as model state",
       f"loose Keras variables are not dropped by {_FRESH}", KERAS, fw.variables),
    _r("keras.flatten_layers", "keras", "keras.src.layers.layer", "Layer._flatten_layers",
       "read", "knows what a kept model owns",
       f"{_FRESH} may name layers of kept models as dropped", KERAS, fw.flatten),
    _r("keras.outbound_nodes", "keras", "keras.src.ops.operation",
       "Operation._outbound_nodes, Node.operation", "write",
       "unlinks dropped heads from the graphs of kept base models",
       "dropped heads stay linked to kept base models (their weights stay)", KERAS, fw.outbound),
    _r("keras.keras_history", "keras", "keras.src.ops.node", "KerasTensor._keras_history",
       "read", "keeps the symbolic tensors of kept models",
       f"{_FRESH} cannot tell which symbolic tensors kept models use", KERAS, fw.history),
    _r("keras.callback_model", "keras", "keras.src.callbacks.callback", "Callback._model",
       "write", "cuts History.model, so an old model goes while its numbers stay",
       "history.model keeps old models alive", KERAS, fw.callback),
    _r("keras.optimizer_build", "keras", "keras.src.optimizers.base_optimizer",
       "BaseOptimizer.build (wrapped)", "write", "frees between the models of one loop",
       "a loop in one cell keeps every model it trains", KERAS, fw.optimizer_build),
    _r("keras.backend_name", "keras", "keras.src.backend.config", "backend.config.backend()",
       "read", "tells which backend Keras runs on",
       "the Keras backend is guessed from what is imported", KERAS, fw.backend_name),
    _r("keras.sequential_inner", "keras", "keras.src.models.sequential",
       "Sequential._functional", "read", "counts a Sequential once, not with its inner model",
       "a Sequential is listed twice in %gpu_mem --deep", KERAS, fw.sequential),
    _r("keras.train_function", "keras", "keras.src.models.model",
       "Model.make_train_function(force=)", "write",
       "find_batch_size leaves the model as it came", "find_batch_size is off", KERAS, fw.trainer),
    _r("tf_keras.name_uids", "tf-keras", "tf_keras.src.backend",
       "backend.PER_GRAPH_OBJECT_NAME_UIDS", "read", "counts auto-named layers (tf-keras)",
       "the layer-name counter is not shown", TF_KERAS, fw.tf_keras_uids),
    _r("tf_keras.outbound_nodes", "tf-keras", "tf_keras.src.engine.base_layer",
       "Layer._outbound_nodes_value", "write", "unlinks dropped heads from kept base models",
       "dropped heads stay linked to kept base models (their weights stay)", TF_KERAS,
       fw.tf_keras_outbound),
    _r("tf_keras.optimizer_build", "tf-keras", "tf_keras.src.optimizers.optimizer",
       "_BaseOptimizer.build (wrapped)", "write", "frees between the models of one loop",
       "a loop in one cell keeps every model it trains", TF_KERAS, fw.tf_keras_build),
    _r("jax.started", "jax", "jax._src.xla_bridge", "xla_bridge.backends_are_initialized",
       "read", "tells whether JAX has started its devices",
       "JAX's figures are shown only once Keras runs on it", "jax 0.4.30-0.10", fw.jax_started),
    _r("jax.compiled", "jax", "jax._src.interpreters.pxla", "pxla._cached_compilation",
       "read", "counts JAX's compiled functions", "JAX's compiled-function count is not shown",
       "jax 0.4.30-0.10", fw.jax_compiled),
    _r("torch.dynamo", "torch", "torch._dynamo", "torch._dynamo.reset", "write",
       "empties torch.compile's caches", f"torch.compile's caches are kept by {_FRESH}",
       "torch 2.4-2.13", fw.dynamo),
    _r("ipython.compiler", "ipython", "IPython.core.compilerop",
       "compile.cache/extra_flags/ast_parse", "read",
       "compiles a %%fresh_model cell as a plain cell", f"{_FRESH} is off", IPYTHON, jp.compiler),
    _r("ipython.cell_names", "ipython", "IPython.core.compilerop", "compile._filename_map",
       "write", "names a re-run %%fresh_model cell's code In[N] in tracebacks",
       f"a re-run {_FRESH} cell's traceback names the In[N] of its first run", IPYTHON,
       jp.cell_names),
    _r("ipython.render_hook", "ipython", "IPython.core.interactiveshell",
       "showtraceback's call of _render_traceback_", "read",
       "shows a %%fresh_model cell's error from the cell's own line",
       "a %%fresh_model cell's error shows IPython's and kerasmagic's frames", IPYTHON,
       jp.render_hook),
    _r("ipython.run_code", "ipython", "IPython.core.interactiveshell",
       "InteractiveShell.run_code's code", "read", "finds where a cell starts in a stack",
       "stored tracebacks and op stack traces reach above the cell", IPYTHON, jp.run_code),
    _r("ipython.traceback", "ipython", "IPython.core.ultratb",
       "InteractiveTB.structured_traceback (and .tb, once set)", "write",
       "drops a stored error's frames; shows errors from the cell's line",
       "a stored error keeps its models", IPYTHON, jp.traceback),
    _r("ipython.events", "ipython", "IPython.core.events", "events.callbacks['post_execute']",
       "write", "holds Ctrl-C from the cell's last line on",
       "a Ctrl-C just after a cell may be lost", IPYTHON, jp.events),
    _r("ipython.magics", "ipython", "IPython.core.magic", "magics_manager.magics, .registry",
       "write", "removes the magics at %unload_ext", "%unload_ext leaves the magics",
       IPYTHON, jp.magics),
    _r("ipython.output_cache", "ipython", "IPython.core.displayhook",
       "displayhook._, __, ___, user_ns_hidden", "write",
       "drops models held by Out[] and _", "models shown as a cell's value stay alive",
       IPYTHON, jp.output_cache),
    _r("ipython.transformers", "ipython", "IPython.core.interactiveshell",
       "input_transformers_cleanup, ast_transformers", "write",
       "refuses a cell that does not compile; awaits at top level",
       f"{_FRESH} cells are checked only when they run", IPYTHON, jp.transformers),
    _r("ipykernel.shell_parent", "ipykernel", "ipykernel.kernelbase", "Kernel._shell_parent",
       "write", "answers the sidebar while a cell runs",
       "sidebar requests wait for the running cell", IPYKERNEL, jp.shell_parent),
    _r("ipykernel.handler_hooks", "ipykernel", "ipykernel.kernelbase",
       "Kernel.pre_handler_hook, post_handler_hook", "write",
       "holds a Ctrl-C that lands in the kernel's code around a cell",
       "a Ctrl-C just before or after a cell is left to ipykernel", IPYKERNEL, jp.handler_hooks),
    _r("ipykernel.io_loop", "ipykernel", "ipykernel.kernelbase", "kernel.io_loop", "read",
       "runs the sidebar's Free memory and Scan between cells",
       "the sidebar's Free memory and Scan are off", IPYKERNEL, jp.io_loop),
    _r("ipykernel.comm_manager", "ipykernel", "ipykernel.kernelbase",
       "the comm manager's register_target and targets", "write", "opens the sidebar",
       "the sidebar cannot connect", IPYKERNEL, jp.comm_manager),
    _r("ipywidgets.handle_msg", "ipywidgets", "ipywidgets.widgets.widget",
       "Widget._handle_msg (overridden)", "write",
       "drops a malformed frontend message quietly",
       "a malformed widget message prints a traceback", "ipywidgets 7.7.1-8.1", jp.widget_messages),
    _r("glibc.mallopt", "glibc", "ctypes", "mallopt(M_MMAP_THRESHOLD)", "write",
       "keeps big freed blocks off the heap, so RSS falls when memory is freed",
       "RSS may stay up after memory is freed", "glibc 2.36", jp.mallopt),
    _r("cpython.bytecode", "cpython", "dis", "opcodes, exception tables, tracing", "read",
       "raises again a Ctrl-C a library swallowed or a callback lost",
       "a Ctrl-C a library swallows is left to Python", "CPython 3.11-3.13", jp.bytecode,
       own_line=True),
)
# fmt: on
