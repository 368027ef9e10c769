"""Everything that holds an old model's tensors is model state: symbolic tensors, layers,
optimizers, metrics and variables go by the rules models go by, read through TF's allocator."""

from __future__ import annotations

import weakref

import pytest
from conftest import run
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic.cleanup import last_report

FUNCTIONAL = """
inp = keras.Input((20,))
h = keras.layers.Dense(1024, activation="relu")(inp)
h = keras.layers.Dense(1024, activation="relu")(h)
out = keras.layers.Dense(2)(h)
model = keras.Model(inp, out)
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, epochs=1, batch_size=64, verbose=0)
"""
IN_USE = "tf.config.experimental.get_memory_info('CPU:0')['current']"


def fresh(shell: InteractiveShell, cell: str, line: str = "") -> object:
    return run(shell, f"%%fresh_model {line}\n{cell}")


def test_a_functional_cell_rerun_starts_from_the_same_allocator_bytes(
    kip: InteractiveShell,
) -> None:
    """The functional API rebinds ``inp`` and ``h``: those KerasTensors kept the old layers and
    their weights (one to two models' weights at every re-run's start)."""
    run(kip, "starts = []")
    for _ in range(5):
        fresh(kip, f"starts.append({IN_USE})\n{FUNCTIONAL}")
    starts = kip.user_ns["starts"]
    assert starts[4] == starts[1], starts  # exact: the allocator counts bytes
    assert starts[1] <= starts[0] + 2**20, starts  # nothing of the previous run is left


def test_the_report_names_the_symbolic_tensors_it_dropped(kip: InteractiveShell) -> None:
    run(kip, FUNCTIONAL)
    old_layer = weakref.ref(kip.ev("model.layers[2]"))
    fresh(kip, FUNCTIONAL)
    report = last_report()
    assert report is not None
    dropped = " ".join(report.dropped)
    assert "h (a KerasTensor holding 2 layers, 4.1 MB)" in dropped, dropped
    assert "inp (a KerasTensor, no weights)" in dropped, dropped
    assert old_layer() is None


def test_layers_optimizers_metrics_and_variables_under_rebound_names_go(
    kip: InteractiveShell,
) -> None:
    cell = (
        "dense = keras.layers.Dense(64)\n"
        "dense.build((None, 20))\n"
        "opt = keras.optimizers.Adam()\n"
        "acc = keras.metrics.SparseCategoricalAccuracy()\n"
        "w = tf.Variable(tf.zeros((100, 100)))\n"
        "kv = keras.Variable(np.zeros((10, 10)))\n"
    )
    run(kip, cell)
    refs = {name: weakref.ref(kip.user_ns[name]) for name in ("dense", "opt", "acc", "w", "kv")}
    fresh(kip, "seen = sorted(n for n in ('dense', 'opt', 'acc', 'w', 'kv') if n in globals())\n"
          + cell)  # fmt: skip
    assert kip.user_ns["seen"] == []
    assert all(ref() is None for ref in refs.values()), {n: r() for n, r in refs.items()}
    dropped = " ".join(last_report().dropped)  # type: ignore[union-attr]
    assert "dense (a Dense layer, 5.2 KB)" in dropped and "w (a variable, 39.1 KB)" in dropped


def test_a_layer_shared_with_a_kept_model_stays_and_the_model_still_trains(
    kip: InteractiveShell,
) -> None:
    run(kip, "shared = keras.layers.Dense(8)\nbase = keras.Sequential([keras.Input((20,)), shared,"
        " keras.layers.Dense(2)])\nbase.compile('adam', 'mse')")  # fmt: skip
    fresh(kip, "shared = keras.layers.Dense(8)")
    report = last_report()
    assert report is not None and report.dropped == (), report.dropped  # the base owns it
    fresh(kip, "base.fit(x, np.zeros((256, 2)), epochs=1, verbose=0)")


def test_a_kept_bases_tensors_stay(kip: InteractiveShell) -> None:
    run(kip, "base = build(16)\nfeatures = base.layers[0].output")
    fresh(kip, "features = base.layers[1].output")
    report = last_report()
    assert report is not None and report.dropped == (), report.dropped  # the base's own


def test_a_history_under_a_rebound_name_keeps_its_numbers(kip: InteractiveShell) -> None:
    run(kip, "model = build()\nhistory = model.fit(x, y, epochs=1, verbose=0)")
    fresh(kip, "numbers = history.history\nmodel = build()\nhistory = None")
    assert "loss" in kip.user_ns["numbers"]


def test_state_in_the_output_cache_is_forgotten(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "keras.layers.Dense(4)")  # displayed: Out[n] holds the layer
    n = kip.execution_count - 1
    held = weakref.ref(kip.user_ns["Out"][n])
    fresh(kip, "z = 1")
    assert held() is None and n not in kip.user_ns["Out"]


def test_deep_names_a_kerastensor_that_still_holds_dropped_layers(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, FUNCTIONAL)
    run(kip, "del model, history\nimport gc\ngc.collect()")
    capsys.readouterr()
    kip.run_line_magic("gpu_mem", "--deep")
    out = capsys.readouterr().out
    assert "KerasTensor" in out and "h" in out and "4.1 MB" in out, out


def test_a_kept_base_lets_go_of_the_heads_built_on_it(kip: InteractiveShell) -> None:
    """Keras records every call on a layer's outputs in the layer: a kept base held every head
    ever built on it, and the heads' weights (4 MB a run here), run after run."""
    run(kip, "base = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64)], name='base')")
    head = (
        f"starts.append({IN_USE})\n"
        "inp = keras.Input((20,))\n"
        "h = keras.layers.Dense(1024, activation='relu')(base(inp))\n"
        "out = keras.layers.Dense(2)(keras.layers.Dense(1024)(h))\n"
        "model = keras.Model(inp, out)\n"
        "model.compile('adam', keras.losses.SparseCategoricalCrossentropy(from_logits=True))\n"
        "history = model.fit(x, y, epochs=1, verbose=0)\n"
    )
    run(kip, "starts = []")
    for _ in range(4):
        fresh(kip, head)
    starts = kip.user_ns["starts"]
    assert starts[3] == starts[1] == starts[0], starts
    notes = last_report().notes  # type: ignore[union-attr]
    assert "unlinked a layer no kept model uses from the graphs of kept models" in notes
    assert "h (a KerasTensor holding 1 layer, 260.0 KB)" in last_report().dropped  # type: ignore[union-attr]
    fresh(kip, "base.compile('adam', 'mse')\nbase.fit(x, np.zeros((256, 64)), epochs=1, verbose=0)")
