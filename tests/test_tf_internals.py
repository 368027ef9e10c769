"""The two TensorFlow fixes against the installed TensorFlow: registry purge and string stacks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from kerasmagic.backends.tensorflow import stack as tfstack  # noqa: E402
from kerasmagic.backends.tensorflow.graphs import (  # noqa: E402
    custom_gradient_count,
    purge_custom_gradients,
)
from kerasmagic.compat import registry  # noqa: E402

X = np.random.default_rng(0).random((64, 4), dtype=np.float32)
Y = np.random.default_rng(1).integers(0, 2, 64)


def fitted() -> keras.Model:
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    m.fit(X, Y, verbose=0)
    return m


def test_purge_drops_dead_graphs_and_keeps_live_ones() -> None:
    keeper = fitted()
    purge_custom_gradients()
    base = custom_gradient_count()
    for _ in range(3):
        fitted()
    assert custom_gradient_count() == base + 6  # the leak: +2 per fitted model
    result = purge_custom_gradients()
    assert result.dropped == 6 and result.kept == base and result.unknown == 0
    assert custom_gradient_count() == base
    assert np.isfinite(keeper.fit(X, Y, verbose=0).history["loss"][0])


def test_purge_without_tensorflow_registry_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorflow.python.framework import ops

    monkeypatch.setattr(ops, "gradient_registry", object())
    collected: list[int] = []
    result = purge_custom_gradients(collect=lambda: collected.append(1))
    assert result.dropped == 0 and "not found" in (result.message or "") and collected == [1]


def _frames(trace: object) -> list[tuple[str, int, str]]:
    """The frames of an op's trace that are not TensorFlow's own (kerasmagic records these)."""
    frames = [(f.filename, f.lineno, f.name) for f in trace]  # type: ignore[attr-defined]
    return [f for f in frames if not ("tensorflow/python" in f[0] and "keras" not in f[0])]


def test_string_stacks_match_tensorflows_own() -> None:
    def trace_ops() -> list[list[tuple[str, int, str]]]:
        @tf.function
        def f(v: tf.Tensor) -> tf.Tensor:
            return tf.reduce_sum(tf.nn.relu(v * 2.0))

        graph = f.get_concrete_function(tf.TensorSpec([3])).graph
        return [_frames(op.traceback) for op in graph.get_operations()]

    was_installed = tfstack.installed()
    traces = []
    for patched in (False, True):  # one call site, so the test's own frame is identical
        tfstack.uninstall()
        if patched:
            assert tfstack.install() is None and tfstack.installed()
        traces.append(trace_ops())
    if not was_installed:
        tfstack.uninstall()
    original, patched_traces = traces
    assert patched_traces == original and len(original) >= 4


def test_user_frames_in_tf_error_messages_survive() -> None:
    tfstack.install()

    @tf.function
    def bad(v: tf.Tensor) -> tf.Tensor:
        return tf.reshape(v, [7])  # line recorded in the op's stack

    with pytest.raises(Exception, match="reshape") as err:
        bad(tf.ones([3]))
    assert "test_tf_internals.py" in str(err.value) or "bad" in str(err.value)


def _graph_traces(depth: int) -> list[list[tuple[str, int, str]]]:
    """Build a TF1 graph from ``depth`` extra frames: ops on distinct lines, then a loop."""
    if depth:
        return _graph_traces(depth - 1)
    with tf.Graph().as_default() as graph:
        v = tf.constant([1.0, 2.0])
        v = tf.nn.relu(v * 2.0)  # distinct lines: distinct stacks
        w = tf.reduce_sum(v)
        for _ in range(3):  # one line, three ops: the same stack again (remembered)
            w = tf.add(w, 1.0)
    return [_frames(op.traceback) for op in graph.get_operations()]


def _both(make: Callable[[], object]) -> tuple[object, object]:
    """Return ``make()`` under TensorFlow's capture, then under kerasmagic's (cold)."""
    was_installed, out = tfstack.installed(), []
    for patched in (False, True):  # one call site, so the frames above are identical
        tfstack.uninstall()
        assert not patched or tfstack.install() is None
        out.append(make())
    if not was_installed:
        tfstack.uninstall()
    return out[0], out[1]


@pytest.mark.parametrize("depth", [0, 40])
def test_graph_mode_traces_match_tensorflows_own(depth: int) -> None:
    native, ours = _both(lambda: _graph_traces(depth))
    assert ours == native and len(native) >= 8  # type: ignore[arg-type]
    users = [[f for f in t if f[2] == "_graph_traces"] for t in native]  # type: ignore[union-attr]
    assert all(len(u) == depth + 1 for u in users)  # the whole stack, not only the last frames


def test_remembered_traces_survive_clear_and_reset_of_the_tree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    traces = []
    for step in range(5):
        if step == 0:
            tfstack.uninstall()  # TensorFlow's own, for reference
        elif step == 1:
            tfstack.install()
        elif step == 3:
            assert tfstack.clear_cache() > 0 and tfstack.clear_cache() == 0
        else:
            monkeypatch.setattr(tfstack, "MAX_NODES", 3)  # resets after every new stack
        traces.append(_graph_traces(5))  # one call site for all
    assert all(t == traces[0] for t in traces), "a remembered trace differs from TF's"
    assert tfstack.clear_cache() < 200  # only what was added since the last reset


def test_autograph_source_mapped_frames_match_tensorflows_own() -> None:
    def trace() -> list[list[tuple[str, int, str]]]:
        @tf.function  # autograph converts this, so TensorFlow maps its frames back here
        def f(v: tf.Tensor) -> tf.Tensor:
            if tf.reduce_sum(v) > 0:
                v = v * 2.0
            return tf.nn.relu(v)

        graph = f.get_concrete_function(tf.TensorSpec([3])).graph
        return [_frames(op.traceback) for op in graph.get_operations()]

    native, ours = _both(trace)
    assert ours == native
    lines = {line for t in native for (name, line, _) in t if name == __file__}  # type: ignore[union-attr]
    assert len(lines) >= 3  # the ops point at the user's own lines, not autograph's copy


def test_runtime_error_names_the_users_line() -> None:
    def run_bad() -> str:
        @tf.function(input_signature=[tf.TensorSpec([None])])
        def bad(v: tf.Tensor) -> tf.Tensor:
            return tf.gather(v, [10])  # fails when it runs, not when it is traced

        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            bad(tf.ones([3]))
        return str(err.value).partition("indices[0]")[0]  # TF's C++ formats this message

    native, ours = _both(run_bad)
    line = run_bad.__code__.co_firstlineno + 3
    assert ours == native, "TensorFlow's 'defined at' lists other frames with kerasmagic's capture"
    assert "defined at" in ours and f"line {line}, in bad" in ours  # type: ignore[operator]
    assert "tensorflow/python" not in ours  # type: ignore[operator]


CELL_TRACES = (
    "{prefix}import tensorflow as tf\n"
    "def f(v):\n"
    "    return tf.nn.relu(v * 2.0)\n"
    "g = tf.function(f).get_concrete_function(tf.TensorSpec([3])).graph\n"
    "traces = [[(x.filename, x.lineno, x.name) for x in op.traceback] for op in g.get_operations()]"
)


def is_cell(function: str) -> bool:
    """Return whether a frame's function name is a notebook cell's: ``<module>``, or IPython
    7.34's ``<cell line: N>``."""
    return function == "<module>" or function.startswith("<cell line")


@pytest.mark.parametrize("prefix", ["", "%%fresh_model -q\n"])
def test_traces_end_at_the_notebook_cell(ip: object, prefix: str) -> None:
    """Frames above the cell (IPython, the kernel, kerasmagic's runner) are not recorded."""
    from kerasmagic.shellstate import state_of

    shell: Any = ip
    state: Any = state_of(shell)
    found = []
    for patched in (False, True):
        tfstack.uninstall()
        assert not patched or tfstack.install() is None
        state.magics.patch_stack_traces = patched  # else %%fresh_model's cleanup patches
        assert shell.run_cell(CELL_TRACES.format(prefix=prefix)).success
        found.append(shell.user_ns["traces"])
    native, ours = found
    cell = [f for t in ours for f in t if is_cell(f[2])]
    assert cell and all(is_cell(t[0][2]) for t in ours), "a trace goes above the cell"
    assert any("IPython" in f[0] for t in native for f in t)  # TensorFlow's own goes on up
    for mine, theirs in zip(ours, native, strict=True):
        kept = [f for f in theirs if not ("tensorflow/python" in f[0] and "keras" not in f[0])]
        start = max(i for i, f in enumerate(kept) if is_cell(f[2]))  # the cell's own frame
        assert [f[1:] for f in mine] == [f[1:] for f in kept[start:]]  # the cell's name differs


REPRO = """
import sys, numpy as np, keras
sys.path.insert(0, {root!r})
from kerasmagic import reset
from kerasmagic.backends.tensorflow import stack as tfstack
x = np.random.rand(128, 8).astype('float32'); y = np.random.randint(0, 2, 128)
SRC = (
    "m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(2)])\\n"
    "m.compile('adam', keras.losses.SparseCategoricalCrossentropy(from_logits=True))\\n"
    "m.fit(x, y, verbose=0)\\n"
)
ns = {{'keras': keras, 'x': x, 'y': y}}
refs = {{}}
for patch in (False, True):
    if patch:
        tfstack.install()
    code = compile(SRC, f'<cell-{{patch}}>', 'exec')  # a re-run cell is a new code object
    exec(code, ns)
    reset(ns, rebinding=['m'], patch_stack_traces=patch)
    refs[patch] = sys.getrefcount(code) - 2
print(refs[False], refs[True])
"""


@pytest.mark.slow
def test_string_stacks_stop_pinning_old_cells_code() -> None:
    # TensorFlow's C++ capture keeps a reference to a cell's code object for every distinct
    # stack it records there, forever (invisible to gc); string stacks record none.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = textwrap.dedent(REPRO.format(root=root))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    unpatched, patched = map(int, out.stdout.split()[-2:])
    assert unpatched > 100, (unpatched, patched)  # ~290 with TF 2.21 for one small fit
    assert patched < unpatched / 5, (unpatched, patched)  # what is left: the eager path


def test_a_stack_of_tensorflows_own_frames_still_records_one() -> None:
    """An op made from TensorFlow's frames alone keeps its innermost one (never an empty trace)."""
    tfstack.install()
    namespace: dict[str, Any] = {"tf": tf}
    fake = "/site-packages/tensorflow/python/ops/made_up.py"  # TensorFlow's by its C++ rule
    exec(compile("def make(v):\n    return tf.nn.relu(v)\n", fake, "exec"), namespace)
    with tf.Graph().as_default() as graph:
        v = tf.constant([1.0])
        tfstack_stop = tfstack._stops.copy()
        try:
            tfstack.stop_at(sys._getframe().f_code)  # nothing above this test is recorded
            namespace["make"](v)
        finally:
            tfstack._stops.clear()
            tfstack._stops.update(tfstack_stop)
    relu = next(op for op in graph.get_operations() if op.type == "Relu")
    frames = [(f.filename, f.name) for f in relu.traceback]
    assert len(frames) == 1 and "tensorflow/python" in frames[0][0]  # the innermost kept
    assert relu.traceback.last_user_frame() is not None


def test_a_failing_string_capture_falls_back_to_tensorflows_own(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The patch replaces TF's capture for every op: if it raised, model building broke."""
    native, _ = _both(lambda: _graph_traces(0))

    def broken(*args: object) -> object:
        raise RuntimeError("a TensorFlow that changed under the patch")

    monkeypatch.setattr(tfstack, "find", broken)
    monkeypatch.setattr(registry, "_said", set())  # the one say-once: nothing said yet
    was_installed = tfstack.installed()
    tfstack.uninstall()
    assert tfstack.install() is None
    try:
        with caplog.at_level("WARNING"):
            ours = _graph_traces(0)  # the same call site as TensorFlow's above
    finally:
        if not was_installed:
            tfstack.uninstall()

    def inner(traces: Any) -> list[list[tuple[str, int, str]]]:  # from _graph_traces down
        return [[f for f in trace if f[2] == "_graph_traces"] for trace in traces]

    assert inner(ours) == inner(native) and len(ours) == len(native) >= 8  # type: ignore[arg-type]
    warned = [r for r in caplog.records if "string op stack traces failed" in r.getMessage()]
    assert len(warned) == 1  # once, not once per op


def test_a_ctrl_c_inside_the_string_capture_shows_tensorflows_frames_only(
    ip: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TensorFlow's own capture is C++: a Ctrl-C while it records an op's stack shows TF's
    frames only. The string capture stands in for it, so IPython hides its frames too (a
    fault-suite run once read its source lines, a "kerasmagic:" message among them, as noise)."""

    def interrupted(*args: object) -> object:
        raise KeyboardInterrupt

    was_installed = tfstack.installed()
    assert tfstack.install() is None
    ip.run_cell("import tensorflow as tf")  # kerasmagic's one graph op before a cell: made
    monkeypatch.setattr(tfstack, "find", interrupted)
    try:
        result = ip.run_cell("tf.function(lambda v: v * 2.0)(tf.ones(3))")
    finally:
        if not was_installed:
            tfstack.uninstall()
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "interrupted(*args)" in shown and "tensorflow/python" in shown  # the frames around it
    assert "kerasmagic/" not in shown and "[... skipping hidden 2 frame]" in shown, shown
