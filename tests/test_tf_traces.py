"""Traces that a user's ``tf.function`` keeps of dropped models, against real TF in a real shell."""

from __future__ import annotations

import math
import weakref
from typing import Any

import pytest
from conftest import run
from IPython.core.interactiveshell import InteractiveShell
from shared_cells import TRAIN_STEP

from kerasmagic.backends.tensorflow.graphs import clear_stale_traces, custom_gradient_count

STEP = TRAIN_STEP
LOOP = """%%fresh_model -q
model, opt = fresh_pair()
for _ in range(2):
    loss = float(train_step(model, opt, x, y))
"""
IN_USE = "tf.config.experimental.get_memory_info('CPU:0')['current']"


def _functions() -> int:
    from tensorflow.python.eager import context

    return len(context.context().list_function_names())


def _graphs(shell: InteractiveShell) -> list[weakref.ref[Any]]:
    step = shell.user_ns["train_step"]
    return [weakref.ref(c.graph) for c in step._list_all_concrete_functions()]


def test_earlier_cell_tf_function_forgets_dropped_models(kip: InteractiveShell) -> None:
    run(kip, STEP)
    run(kip, LOOP)
    first = _graphs(kip)
    run(kip, LOOP)
    sizes = (custom_gradient_count(), _functions())
    for _ in range(3):
        run(kip, LOOP)
    step = kip.user_ns["train_step"]
    assert step.experimental_get_tracing_count() == 1  # only the live model's trace
    assert [ref() for ref in first] == [None]  # the first model's traced graph is freed
    assert (custom_gradient_count(), _functions()) == sizes
    assert math.isfinite(kip.user_ns["loss"])  # the retraced function trains the new model


def test_report_names_the_cleared_function(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, STEP)
    run(kip, LOOP)
    run(kip, LOOP.replace(" -q", " -v"))  # the detail under the line names what was released
    assert "cleared 1 trace of tf.function train_step" in capsys.readouterr().out


def test_trace_of_a_kept_model_stays(kip: InteractiveShell) -> None:
    run(kip, STEP)
    run(kip, "base, base_opt = fresh_pair(16)\nbase_loss = float(train_step(base, base_opt, x, y))")
    for _ in range(3):
        run(kip, LOOP)
    step = kip.user_ns["train_step"]
    assert step.experimental_get_tracing_count() == 2  # base's trace and the live model's
    run(kip, "base_loss = float(train_step(base, base_opt, x, y))")
    assert step.experimental_get_tracing_count() == 2  # base ran on its old trace: no retrace


def test_trace_of_a_kept_model_sharing_layers_with_a_dropped_one_stays(
    kip: InteractiveShell,
) -> None:
    run(kip, STEP)
    shared = "keras.Sequential([keras.Input((20,)), encoder, keras.layers.Dense(2)])"
    run(kip, f"encoder = keras.layers.Dense(8)\nbase = {shared}")
    run(kip, "base_opt = keras.optimizers.Adam()")
    run(kip, "base_opt.build(base.trainable_variables)\nloss = train_step(base, base_opt, x, y)")
    cell = f"%%fresh_model -q\nmodel = {shared}\nopt = keras.optimizers.Adam()\n"
    cell += "opt.build(model.trainable_variables)\nloss = float(train_step(model, opt, x, y))"
    for _ in range(2):
        run(kip, cell)
    step = kip.user_ns["train_step"]
    assert step.experimental_get_tracing_count() == 2
    run(kip, "loss = float(train_step(base, base_opt, x, y))")
    assert step.experimental_get_tracing_count() == 2  # base's trace survived: no retrace


def test_traces_of_models_deleted_without_the_magic_are_freed(kip: InteractiveShell) -> None:
    run(kip, STEP)
    for _ in range(3):  # plain cells: each model dies when the name is rebound
        run(kip, "model, opt = fresh_pair()\nloss = float(train_step(model, opt, x, y))")
    assert kip.user_ns["train_step"].experimental_get_tracing_count() == 3
    run(kip, "%%fresh_model -q\nz = 1")
    assert kip.user_ns["train_step"].experimental_get_tracing_count() == 1


def test_refitted_kept_model_and_fresh_models_do_not_accumulate(kip: InteractiveShell) -> None:
    run(kip, "kept = build()\nkept.fit(x, y, epochs=1, verbose=0)\nfit_fn = kept.train_function")
    cell = (
        "%%fresh_model -q\nmodel = build()\nmodel.fit(x, y, verbose=0)\nkept.fit(x, y, verbose=0)"
    )
    run(kip, cell)
    sizes = (custom_gradient_count(), _functions())
    for _ in range(3):
        run(kip, cell)
    assert (custom_gradient_count(), _functions()) == sizes
    assert kip.user_ns["kept"].train_function is kip.user_ns["fit_fn"]


INLINE_STEP = """%%fresh_model -q
m = keras.Sequential([keras.Input((20,)), keras.layers.Dense(1024, activation="relu"),
                      keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(2)])
opt = keras.optimizers.Adam()  # built inside the first trace
@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(yb, m(xb), True))
    grads = tape.gradient(loss, m.trainable_variables)
    opt.apply_gradients(zip(grads, m.trainable_variables))
    return loss
loss = float(step(x, y))
"""


def test_a_step_that_builds_its_optimizer_inside_keeps_no_earlier_model(
    kip: InteractiveShell,
) -> None:
    """TensorFlow keeps the first call's variable initializers in a closure for the
    Function's life: re-run, the cell kept the previous model and its Adam slots until the
    next re-run, and the last ones for good (TF's gradient registry held their graph)."""
    run(kip, "import gc\ngc.collect()")
    start = run(kip, IN_USE)
    after = []
    for _ in range(4):
        run(kip, INLINE_STEP)
        after.append(run(kip, "gc.collect() * 0 + " + IN_USE))
    assert after[0] == after[1] == after[2] == after[3], after  # one model and its optimizer
    run(kip, "%%fresh_model -q\nm = opt = step = None")
    assert run(kip, "gc.collect() * 0 + " + IN_USE) == start
    assert math.isfinite(kip.user_ns["loss"])


GLOBAL_STEP = """
@tf.function
def gstep(xb, yb):  # reads the model and optimizer a later cell binds
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(yb, gm(xb), True))
    grads = tape.gradient(loss, gm.trainable_variables)
    gopt.apply_gradients(zip(grads, gm.trainable_variables))
    return loss
"""
GLOBAL_MODEL = """%%fresh_model -q
gm = keras.Sequential([keras.Input((20,)), keras.layers.Dense(8), keras.layers.Dense(2)])
gopt = keras.optimizers.Adam()  # its slots are made inside gstep's first trace
before = [w.numpy().copy() for w in gm.trainable_variables]
loss = float(gstep(x, y))
moved = all((w.numpy() != b).any() for w, b in zip(gm.trainable_variables, before))
"""


def test_a_step_from_an_earlier_cell_trains_each_re_runs_new_model(kip: InteractiveShell) -> None:
    """The custom-loop notebook: a ``tf.function`` step in one cell reads the globals ``gm``
    and ``gopt``, whose slots its first call makes; the model cell is re-run. Without
    kerasmagic the re-run's step runs its old trace and trains the old model, leaving the new
    one as built. With the old traces cleared but the first call's state kept, TensorFlow
    refused the new optimizer's slots: "tf.function only supports singleton tf.Variables
    created on the first call". Every trace held dropped models, so the step starts again as
    on its first call: each re-run trains its own model."""
    run(kip, GLOBAL_STEP + "import gc")
    traces, in_use = [], []
    for _ in range(3):
        run(kip, GLOBAL_MODEL)
        assert kip.user_ns["moved"] is True
        assert int(kip.user_ns["gopt"].iterations.numpy()) == 1
        traces.append(len(kip.user_ns["gstep"]._list_all_concrete_functions()))
        in_use.append(run(kip, "gc.collect() * 0 + " + IN_USE))
    assert traces[0] == traces[1] == traces[2], traces  # the live model's only
    assert in_use[0] == in_use[1] == in_use[2], in_use  # and its tensors
    run(kip, "loss2 = float(gstep(x, y))")  # a later call runs the live trace
    assert int(kip.user_ns["gopt"].iterations.numpy()) == 2


def test_function_in_a_container_or_called_by_a_user_function(kip: InteractiveShell) -> None:
    run(kip, STEP)
    run(kip, "steps = {'main': train_step}\ndel train_step")
    run(kip, "def fit_once(m, o):\n    return float(steps['main'](m, o, x, y))")
    for _ in range(3):
        run(kip, "%%fresh_model -q\nmodel, opt = fresh_pair()\nloss = fit_once(model, opt)")
    assert kip.user_ns["steps"]["main"].experimental_get_tracing_count() == 1


def test_unexpected_cache_layout_is_left_alone_and_reported(kip: InteractiveShell) -> None:
    run(kip, STEP)
    run(kip, "model, opt = fresh_pair()\nloss = float(train_step(model, opt, x, y))")
    step = kip.user_ns["train_step"]
    step._function_cache = dict(step._function_cache._primary)  # as if TF changed its layout
    notes = clear_stale_traces(kip.user_ns, [kip.user_ns["model"]])
    assert len(step._function_cache) == 1
    assert notes == [
        "tf.function train_step keeps 1 trace of dropped models (TensorFlow's trace cache not "
        "as expected; not cleared): re-run the cell that defines it to free them"
    ]


class _Anything:
    def __getattr__(self, name: str) -> Any:
        return self

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # like werkzeug's LocalProxy when unbound
        raise RuntimeError("unbound proxy")


class _Target:
    pass


def test_hostile_objects_in_the_namespace(kip: InteractiveShell) -> None:
    run(kip, STEP)
    run(kip, "model, opt = fresh_pair()\nloss = float(train_step(model, opt, x, y))")
    target = _Target()
    kip.user_ns.update(odd=weakref.proxy(target), anything=_Anything(), bag=[_Anything()])
    del target
    notes = clear_stale_traces(kip.user_ns, [kip.user_ns["model"]])
    assert notes == ["cleared 1 trace of tf.function train_step"]
