"""``%%fresh_model`` against real Keras/TensorFlow in a real in-process IPython shell."""

from __future__ import annotations

import gc
import re
import sys
import weakref

import pytest
from conftest import run
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic.backends.tensorflow.graphs import custom_gradient_count


def ref_to(shell: InteractiveShell, expr: str) -> weakref.ref[object]:
    return weakref.ref(shell.ev(expr))


def model_in_failed_frame(function: str) -> weakref.ref[object]:
    tb = sys.last_traceback
    while tb is not None and tb.tb_frame.f_code.co_name != function:
        tb = tb.tb_next
    assert tb is not None
    return weakref.ref(tb.tb_frame.f_locals["m"])


def fresh(shell: InteractiveShell, cell: str, line: str = "") -> object:
    return run(shell, f"%%fresh_model {line}\n{cell}")


def test_layer_names_reset_between_runs(kip: InteractiveShell) -> None:
    names = []
    for _ in range(3):
        fresh(kip, "model = build()\nname = model.layers[0].name")
        names.append(kip.user_ns["name"])
    assert names == ["dense", "dense", "dense"]


def test_rebound_model_is_dropped_before_the_cell(kip: InteractiveShell) -> None:
    run(kip, "model = build()")
    old = ref_to(kip, "model")
    fresh(kip, "old_alive = 'model' in globals()\nmodel = build()")
    assert kip.user_ns["old_alive"] is False
    assert old() is None and kip.user_ns["model"] is not None


def test_model_in_output_cache_is_dropped(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "build()")  # displayed: held by Out[n], _n and _
    n = kip.execution_count - 1
    held = weakref.ref(kip.user_ns["Out"][n])
    capsys.readouterr()
    fresh(kip, "z = 1")
    assert held() is None
    assert n not in kip.user_ns["Out"] and f"_{n}" not in kip.user_ns
    assert kip.user_ns["_"] == "" and kip.displayhook._ == ""  # type: ignore[attr-defined]
    assert f"Out[{n}]" in capsys.readouterr().out


def test_reset_of_the_notebooks_own_namespace_cuts_its_output_cache(kip: InteractiveShell) -> None:
    """``reset(globals())`` in a notebook is ``reset()``: the shell whose namespace it is has
    its output cache cut; a namespace of its own leaves the shell's alone."""
    import kerasmagic

    run(kip, "build()")
    n = kip.execution_count - 1
    held = weakref.ref(kip.user_ns["Out"][n])
    assert "shell" not in __import__("inspect").signature(kerasmagic.reset).parameters
    kerasmagic.reset({})
    assert held() is not None and n in kip.user_ns["Out"]
    run(kip, "import kerasmagic\nkerasmagic.reset(globals())")
    assert held() is None and n not in kip.user_ns["Out"]


def test_model_behind_older_underscores_is_dropped(kip: InteractiveShell) -> None:
    run(kip, "build()")
    first = weakref.ref(kip.user_ns["_"])
    run(kip, "1")
    run(kip, "2")  # the model is now only in ___ (and Out)
    assert kip.user_ns["___"] is first()
    fresh(kip, "z = 1")
    assert first() is None


def test_model_in_stored_traceback_is_dropped(kip: InteractiveShell) -> None:
    run(kip, "def fail(m):\n    raise ValueError('boom')")
    result = kip.run_cell("fail(build())", store_history=True)
    failed = isinstance(result.error_in_exec, ValueError)
    del result
    held = model_in_failed_frame("fail")
    fresh(kip, "z = 1")
    assert failed
    assert held() is None
    assert sys.last_value is not None  # the error itself is still there for %tb


def test_history_model_link_is_cut_and_numbers_kept(kip: InteractiveShell) -> None:
    run(kip, "h = build().fit(x, y, epochs=2, verbose=0)")
    held = weakref.ref(kip.user_ns["h"].model)
    numbers = {k: list(v) for k, v in kip.user_ns["h"].history.items()}
    fresh(kip, "z = 1")
    assert held() is None
    assert kip.user_ns["h"].history == numbers and len(numbers["loss"]) == 2


def test_callback_model_link_is_cut(kip: InteractiveShell) -> None:
    run(kip, "es = keras.callbacks.EarlyStopping(monitor='loss', patience=3)")
    run(kip, "build().fit(x, y, epochs=1, verbose=0, callbacks=[es]);")
    held = weakref.ref(kip.user_ns["es"].model)
    fresh(kip, "z = 1")
    assert held() is None and kip.user_ns["es"].patience == 3


@pytest.mark.parametrize(
    ("setup", "rebind"),
    [
        ("results = [(0.5, build())]", "results = []"),
        ("results = {'fold0': build(), 'score': 0.5}", "results = {}"),
        ("results = (0.5, build())", "results = ()"),
    ],
)
def test_container_the_cell_rebinds_loses_its_models(
    kip: InteractiveShell, setup: str, rebind: str
) -> None:
    run(kip, "m0 = build()")
    kip.user_ns["held"] = weakref.ref(kip.user_ns["m0"])
    run(kip, setup.replace("build()", "m0") + "\ndel m0")
    fresh(kip, f"alive_before_cell = held() is not None\n{rebind}")
    assert kip.user_ns["alive_before_cell"] is False


def test_the_line_names_every_model_a_rebound_container_loses(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "ens = [build(), build()]\nmany = (0.5, [build() for _ in range(5)])")
    capsys.readouterr()
    fresh(kip, "ens = [1]\nmany = (0.5, [])")
    line = capsys.readouterr().out
    assert "dropped ens[0], ens[1]" in line  # not "ens[0]" alone: two models went
    run(kip, "ens = [build(), build()]\nmany = (0.5, [build() for _ in range(5)])")
    capsys.readouterr()
    fresh(kip, "ens = [1]\nmany = (0.5, [])", line="-v")
    detail = " ".join(capsys.readouterr().out.split())  # wrapped at 80 columns
    assert "ens[0], ens[1], many[1][0], many[1][1], many[1][2], many[1][3] and 1 more" in detail
    fresh(kip, "ens = [build(), build()]\nmany = [build() for _ in range(5)]")
    capsys.readouterr()
    fresh(kip, "ens = many = 1")
    assert "dropped ens[0], ens[1] and 5 more\n" in capsys.readouterr().out  # 7 models, 7 said


def test_kept_model_survives_default_and_goes_with_all(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "base = build()")
    base = ref_to(kip, "base")
    capsys.readouterr()
    fresh(kip, "model = build()", line="-v")  # the report's detail, where kept models are
    assert base() is not None
    assert "still alive: base" in capsys.readouterr().out
    fresh(kip, "z = 1", line="--all")
    assert base() is None and "base" not in kip.user_ns and "model" not in kip.user_ns


def test_keep_protects_names_from_all(kip: InteractiveShell) -> None:
    run(kip, "base = build()\nother = build()")
    fresh(kip, "z = 1", line="--all --keep base")
    assert "base" in kip.user_ns and "other" not in kip.user_ns


def test_reset_takes_one_name_as_a_name_and_refuses_a_model_for_a_namespace(
    kip: InteractiveShell,
) -> None:
    import kerasmagic

    run(kip, "model = build()\nother = build()")
    report = kerasmagic.reset(drop_all=True, keep="model")  # not the letters m, o, d, e, l
    assert report.kept == ("model",) and "model" in kip.user_ns and "other" not in kip.user_ns
    with pytest.raises(TypeError, match=r"not a Sequential: to free a model, name it"):
        kerasmagic.reset(kip.user_ns["model"])
    with pytest.raises(TypeError, match="keep takes variable names"):
        kerasmagic.reset(keep=[kip.user_ns["model"]])
    assert "model" in kip.user_ns


def test_kept_model_still_trains_after_cleanup(kip: InteractiveShell) -> None:
    run(kip, "base = build()\nbase.fit(x, y, verbose=0);")
    for _ in range(2):
        fresh(kip, "model = build()\nmodel.fit(x, y, verbose=0);")
    run(kip, "loss = base.fit(x, y, epochs=2, verbose=0).history['loss']")
    assert len(kip.user_ns["loss"]) == 2 and all(v == v for v in kip.user_ns["loss"])


CUSTOM_LAYER = """
@tf.custom_gradient
def twice_grad(v):
    return tf.identity(v), lambda dy: 2.0 * dy

class TwiceGrad(keras.layers.Layer):
    def call(self, v):
        return twice_grad(v)

custom = keras.Sequential([keras.Input((20,)), TwiceGrad(), keras.layers.Dense(2)])
custom.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
custom.fit(x, y, verbose=0)

@tf.function
def grad_of_input(v):
    with tf.GradientTape() as tape:
        tape.watch(v)
        out = tf.reduce_sum(twice_grad(v))
    return tape.gradient(out, v)

@tf.function
def forward(v):
    return tf.reduce_sum(twice_grad(v) * 3.0)
"""


def test_user_custom_gradient_survives_cleanup(kip: InteractiveShell) -> None:
    run(kip, CUSTOM_LAYER)
    run(kip, "probe = tf.ones((2, 3))\nconcrete = forward.get_concrete_function(probe)")
    for _ in range(2):
        fresh(kip, "model = build()\nmodel.fit(x, y, verbose=0);")
    # The traced forward graph is still alive: differentiating it needs its registry entry.
    run(
        kip,
        "with tf.GradientTape() as tape:\n    tape.watch(probe)\n    out = concrete(probe)\n"
        "g = tape.gradient(out, probe).numpy()",
    )
    assert (kip.user_ns["g"] == 6.0).all()
    run(
        kip,
        "g2 = grad_of_input(tf.ones((2, 3))).numpy()\n"
        "loss = custom.fit(x, y, verbose=0).history['loss'][0]",
    )
    assert (kip.user_ns["g2"] == 2.0).all() and kip.user_ns["loss"] == kip.user_ns["loss"]


def test_leak_stops_across_reruns(kip: InteractiveShell) -> None:
    cell = "model = build()\nmodel.fit(x, y, verbose=0)\nmodel.predict(x[:4], verbose=0);"
    counts, objects = [], []
    for _ in range(6):
        fresh(kip, cell, line="-q")
        counts.append(custom_gradient_count())
        gc.collect()
        objects.append(len(gc.get_objects()))
    assert counts[-1] == counts[1]  # without cleanup: +2 per fitted model
    assert objects[-1] - objects[2] < 2_000  # without cleanup: ~+8,000 per model


def test_user_data_survives_byte_for_byte(kip: InteractiveShell) -> None:
    run(
        kip,
        "import itertools\narr = x.copy()\nconfig = {'lr': 1e-3, 'layers': [8, 2]}\n"
        "gen = itertools.count()\nnext(gen)\nn = 42\nblob = b'abc'\n"
        "pairs = [(1, 'a'), (2, 'b')]\nmodel = build()\nmix = [0.5, model, {'m': model, 'k': 3}]",
    )
    before = {k: kip.user_ns[k] for k in ("arr", "config", "gen", "n", "blob", "pairs")}
    arr_bytes = kip.user_ns["arr"].tobytes()
    fresh(kip, "z = 1", line="--all")
    for key, value in before.items():
        assert kip.user_ns[key] is value
    assert kip.user_ns["arr"].tobytes() == arr_bytes
    assert kip.user_ns["config"] == {"lr": 1e-3, "layers": [8, 2]}
    assert next(kip.user_ns["gen"]) == 1
    assert kip.user_ns["mix"] == [0.5, None, {"m": None, "k": 3}]  # only the models went


def test_exception_in_cell_keeps_cleanup_and_namespace(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "model = build()")
    old = ref_to(kip, "model")
    with pytest.raises(ValueError, match="boom"):
        fresh(kip, "model = build()\nraise ValueError('boom')")
    assert old() is None
    assert {"x", "y", "build", "model"} <= set(kip.user_ns)
    assert "kerasmagic: RSS " in capsys.readouterr().out


def test_ctrl_c_in_cell_keeps_namespace(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    result = kip.run_cell(
        "%%fresh_model\nmodel = build()\nraise KeyboardInterrupt", store_history=True
    )
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert {"x", "y", "build", "model"} <= set(kip.user_ns)
    assert "kerasmagic: RSS " in capsys.readouterr().out
    fresh(kip, "ok = model.layers[0].name")  # the kernel carries on
    assert kip.user_ns["ok"] == "dense"


def test_dry_run_reports_and_changes_nothing(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(kip, "model = build()\nbase = build()")
    old = ref_to(kip, "model")
    capsys.readouterr()
    fresh(kip, "model = 1", line="--dry-run")
    out = capsys.readouterr().out
    assert "would drop model" in out and "would keep base" in out
    assert kip.user_ns["model"] is old()


def test_quiet_prints_nothing(kip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    fresh(kip, "z = 1", line="-q")
    assert capsys.readouterr().out == ""


def test_last_expression_is_the_cell_result(kip: InteractiveShell) -> None:
    assert fresh(kip, "a = 2\na * 21", line="-q") == 42


@pytest.mark.parametrize("line", ["--bogus", "--keep", "--all extra"])
def test_bad_flags_are_usage_errors(ip: InteractiveShell, line: str) -> None:
    with pytest.raises(UsageError) as err:
        ip.run_cell_magic("fresh_model", line, "z = 1")
    assert "\n" not in str(err.value).strip()
    assert "z" not in ip.user_ns


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "--isolate --dry-run",
            "--isolate runs the cell in a fresh process: .* not with --dry-run",
        ),
        ("--keep x --isolate", "not with --keep"),
        ("--isolate --all", "not with --all"),
        ("--isolate -v", "not with -v"),
        ("--predict --isolate", "its fits not predicted: not with --predict"),
        ("--dry-run --predict", "--dry-run only says what would be dropped: .* not with --predict"),
        ("-q --dry-run", "the cell does not run: not with -q"),
        ("-qv", "-q prints no report: not with -v"),
    ],
)
def test_flags_one_would_drop_are_refused(ip: InteractiveShell, line: str, message: str) -> None:
    """``--isolate --dry-run`` used to run the cell isolated, the dry run dropped unsaid."""
    ip.user_ns["x"] = 1
    with pytest.raises(UsageError, match=message):
        ip.run_cell_magic("fresh_model", line, "z = 1")
    assert "z" not in ip.user_ns


def test_help_is_generated(ip: InteractiveShell) -> None:
    doc = ip.find_cell_magic("fresh_model").__doc__ or ""
    assert "--all" in doc and "--keep" in doc and "--dry-run" in doc


def test_unload_removes_magics(ip: InteractiveShell) -> None:
    from kerasmagic.imports import AfterImport

    def hooks() -> int:  # the loop guard's (Keras's optimizers), compat's (the frameworks)
        return sum(isinstance(finder, AfterImport) for finder in sys.meta_path)

    assert hooks() == 2
    ip.run_line_magic("unload_ext", "kerasmagic")
    assert ip.find_cell_magic("fresh_model") is None and ip.find_line_magic("gpu_mem") is None
    assert hooks() == 0
    ip.run_line_magic("load_ext", "kerasmagic")
    assert ip.find_cell_magic("fresh_model") is not None and hooks() == 2


def test_a_part_that_fails_to_load_rolls_the_whole_load_back(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_loaded`` was set before the parts loaded: one that failed left a half-loaded shell
    (hooks of the parts before it, magics) that a retry skipped."""
    import types

    from kerasmagic import _extension
    from kerasmagic.shellstate import state_of

    ip.run_line_magic("unload_ext", "kerasmagic")
    hooks = {event: list(ip.events.callbacks[event]) for event in ip.events.callbacks}
    boom = types.ModuleType("kerasmagic_test_boom")
    boom.load = lambda state: (_ for _ in ()).throw(RuntimeError("a part that fails"))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kerasmagic_test_boom", boom)
    monkeypatch.setattr(_extension, "PARTS", (*_extension.PARTS[:4], ("boom", boom.__name__)))
    with pytest.raises(RuntimeError, match="a part that fails"):
        _extension.load(ip)
    assert state_of(ip) is None and ip.find_cell_magic("fresh_model") is None
    assert {e: list(ip.events.callbacks[e]) for e in ip.events.callbacks} == hooks
    monkeypatch.undo()
    ip.run_line_magic("load_ext", "kerasmagic")  # a retry loads everything
    state = state_of(ip)
    assert state is not None and set(state.parts) == {name for name, _ in _extension.PARTS}


def test_model_shared_with_a_kept_name_survives_stripping(kip: InteractiveShell) -> None:
    run(kip, "m0 = build()\nresults = [{'model': m0, 'score': 0.5}]\nbest = results[0]\ndel m0")
    fresh(kip, "results = []")
    assert kip.user_ns["best"]["model"] is not None  # kept under `best`, so not cut anywhere
    assert kip.user_ns["best"]["score"] == 0.5


def test_cells_compile_with_the_shells_future_flags(kip: InteractiveShell) -> None:
    fresh(kip, "def f(x: int) -> int:\n    return x\nann = f.__annotations__", line="-q")
    assert kip.user_ns["ann"] == {"x": int, "return": int}  # not the strings 'int'


def test_keras_settings_survive_the_reset(kip: InteractiveShell) -> None:
    run(kip, "keras.mixed_precision.set_global_policy('mixed_float16')")
    try:
        fresh(kip, "policy = keras.mixed_precision.global_policy().name", line="-q")
        assert kip.user_ns["policy"] == "mixed_float16"
    finally:
        run(kip, "keras.mixed_precision.set_global_policy('float32')")


def test_a_keras_that_cannot_reset_is_said_once_and_the_cell_runs(
    kip: InteractiveShell, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Ctrl-C during ``import keras`` can leave Keras half-imported: its ``clear_session()``
    then raises ("module 'keras.src.backend' has no attribute 'backend'"). The cleanup says so
    in one line, once, and goes on; the cell runs and the names stay."""
    import keras

    from kerasmagic.compat import registry

    def half_imported(*args: object, **kwargs: object) -> None:
        raise AttributeError("module 'keras.src.backend' has no attribute 'backend'")

    monkeypatch.setattr(keras.backend, "clear_session", half_imported)
    monkeypatch.setattr(registry, "_said", set())
    run(kip, "m = build()")
    with caplog.at_level("WARNING"):
        for n in range(2):
            fresh(kip, f"ran = {n}", line="-q")
    said = [r.getMessage() for r in caplog.records if "clear_session() failed" in r.getMessage()]
    assert kip.user_ns["ran"] == 1 and "x" in kip.user_ns and "m" in kip.user_ns
    assert said == [
        "kerasmagic: keras.backend.clear_session() failed (AttributeError: module "
        "'keras.src.backend' has no attribute 'backend'): its names and graphs were not reset; "
        "an import of keras stopped part way leaves it so until the kernel restarts"
    ]


def test_output_holding_only_a_kept_model_stays(kip: InteractiveShell) -> None:
    run(kip, "base = build()")
    run(kip, "base")
    n = kip.execution_count - 1
    fresh(kip, "z = 1", line="-q")
    assert kip.user_ns["Out"][n] is kip.user_ns["base"]


def test_a_cell_that_does_not_compile_drops_nothing(kip: InteractiveShell) -> None:
    run(kip, "model = build()")
    old = ref_to(kip, "model")
    with pytest.raises(SyntaxError):
        fresh(kip, "model = build()\nreturn 5")
    assert kip.user_ns["model"] is old()


BIG = """
def big():
    m = keras.Sequential([keras.Input((20,)), keras.layers.Dense(256), keras.layers.Dense(512),
                          keras.layers.Dense(2)])  # 512 KB of weights: BFC, not the small pool
    m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
starts = []
"""
CELL = """{magic}
starts.append(tf.config.experimental.get_memory_info("CPU:0")["current"])
{cleanup}model = big()
history = model.fit(x, y, verbose=0)
model
"""


@pytest.mark.pair
def test_rerun_starts_with_the_same_allocator_bytes(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """TF's CPU allocator is exact: re-run 5 of a model cell starts with re-run 2's bytes."""
    run(kip, BIG)
    for _ in range(5):
        run(kip, CELL.format(magic="%%fresh_model", cleanup=""))
    starts = kip.user_ns["starts"]
    assert starts[4] == starts[1], starts
    assert re.search(r"; TF tensors \S+ \w+ \(cleanup -[\d.]+ MB", capsys.readouterr().out)


@pytest.mark.pair
def test_hand_cleanup_keeps_allocator_bytes(kip: InteractiveShell) -> None:
    """The contrast the figure above is for: del + clear_session keeps every model's tensors."""
    run(kip, BIG + "model = history = None\n")
    hand = "del model, history\nkeras.backend.clear_session()\nimport gc; gc.collect()\n"
    for _ in range(4):
        run(kip, CELL.format(magic="", cleanup=hand))
    starts = kip.user_ns["starts"]
    assert starts[1] < starts[2] < starts[3], starts
