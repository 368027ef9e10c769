"""Loops need no cleanup code: a K-fold loop written plainly in one cell stays flat, read
through TensorFlow's allocator (exact bytes), and never loses a model something still holds."""

from __future__ import annotations

import gc
import re

import pytest
from conftest import run
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic.cleanup.loops import STARTUP_FROZEN, Freezer

BIG = """
def big():
    m = keras.Sequential([keras.Input((20,)), keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(2)])
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
in_use = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"]
from kerasmagic.walk import model_size_bytes
"""
LOOP = """
after = []
for fold in range(7):
    model = big()
    history = model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    after.append(in_use())
"""


def test_a_plain_kfold_loop_stays_flat(kip: InteractiveShell) -> None:
    run(kip, BIG)
    run(kip, LOOP)
    after, one_model = kip.user_ns["after"], kip.ev("model_size_bytes(model)")
    # Flat: a fold may leave a few MB more or less (the shuffled copies of x that Keras's input
    # pipeline has in flight when fit returns depend on timing), never a model more.
    assert abs(after[6] - after[4]) <= one_model / 2, after
    assert after[6] - after[0] <= 2.5 * one_model, after  # the first, the last two: no more
    thawed = not Freezer.frozen and gc.get_freeze_count() <= STARTUP_FROZEN
    assert thawed  # the cell's end thawed them


def test_without_the_extension_the_same_loop_keeps_every_model(kip: InteractiveShell) -> None:
    """The loop above is flat because of kerasmagic: without it every fold stays."""
    run(kip, BIG)
    kip.run_line_magic("unload_ext", "kerasmagic")
    try:
        run(kip, LOOP)
    finally:
        kip.run_line_magic("load_ext", "kerasmagic")
    after, one_model = kip.user_ns["after"], kip.ev("model_size_bytes(model)")
    assert after[6] - after[0] >= 5.5 * one_model, after


def test_models_the_loop_keeps_stay_and_still_train(kip: InteractiveShell) -> None:
    run(kip, BIG)
    run(kip, LOOP.replace("after = []", "after, kept = [], []") + "    kept.append(model)\n")
    models = kip.user_ns["kept"]
    assert len({id(m) for m in models}) == 7
    run(kip, "for m in kept: m.fit(x, y, epochs=1, verbose=0)")  # every kept model trains


def test_a_train_step_from_an_earlier_cell_drops_the_traces_of_dead_models(
    kip: InteractiveShell,
) -> None:
    """A ``tf.function`` from an earlier cell traces once per model and kept every trace (the
    graph and the model's variables) after the model died."""
    run(kip, BIG)
    run(
        kip,
        "@tf.function\n"
        "def train_step(model, opt, xb, yb):\n"
        "    with tf.GradientTape() as tape:\n"
        "        loss = tf.reduce_mean(tf.square(model(xb) - tf.cast(yb[:, None], tf.float32)))\n"
        "    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),\n"
        "                            model.trainable_variables))\n",
    )
    run(
        kip,
        "after = []\n"
        "for fold in range(6):\n"
        "    model, opt = big(), keras.optimizers.Adam()\n"
        "    opt.build(model.trainable_variables)\n"
        "    for _ in range(2):\n"
        "        train_step(model, opt, x[:64], y[:64])\n"
        "    after.append(in_use())\n",
    )
    after = kip.user_ns["after"]
    assert abs(after[5] - after[3]) <= kip.ev("model_size_bytes(model)") / 4, after
    traces = kip.ev("len(train_step._list_all_concrete_functions())")
    assert traces <= 3, traces  # the traces of the models that died went


def test_an_error_in_an_optimizers_build_shows_keras_frames_only(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """The wrapped ``build`` is hidden as IPython hides its own wrappers: the traceback a user
    reads (an error, or a Ctrl-C mid-build) is the one they get without kerasmagic."""
    run(kip, "opt = keras.optimizers.Adam()")
    result = kip.run_cell("opt.build([object()])")  # Keras's own error: no variables
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert isinstance(result.error_in_exec, AttributeError)
    assert "optimizers/adam.py" in shown and "[... skipping hidden 1 frame]" in shown
    assert "kerasmagic/" not in shown, shown
