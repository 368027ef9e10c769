"""Promises of ``%%fresh_model`` in notebooks written the ordinary way (issue: trust).

Kept structures at any depth, hostile objects in the namespace, Ctrl-C during kerasmagic's own
work, and load/unload cycles; each in a real in-process IPython shell with real Keras.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from typing import Any

import pytest
from conftest import run
from IPython.core.interactiveshell import InteractiveShell
from shared_cells import INTERRUPT_IN_GC_CALLBACK

import kerasmagic.live as live_module
from kerasmagic.live import get_monitor


def _models(shell: InteractiveShell, expr: str) -> list[Any]:
    return list(shell.ev(expr))


# -- kept structures at any depth ----------------------------------------------------------
NESTED_LOG = """
%%fresh_model -q
res = {"model": build(), "fold": len(log["exp"]["runs"])}
res["model"].fit(x, y, epochs=1, verbose=0)
log["exp"]["runs"].append(res)
"""


def test_model_in_a_deeply_nested_kept_log_survives_rebinding(kip: InteractiveShell) -> None:
    run(kip, 'log = {"exp": {"runs": []}}')
    for _ in range(3):
        run(kip, NESTED_LOG)
    runs = kip.user_ns["log"]["exp"]["runs"]
    models = [r["model"] for r in runs]
    assert all(m is not None for m in models), "a model held by the kept `log` was cut"
    assert len({id(m) for m in models}) == 3
    models[0].fit(kip.user_ns["x"], kip.user_ns["y"], epochs=1, verbose=0)  # still trains


def test_model_held_by_a_kept_objects_attribute_survives(kip: InteractiveShell) -> None:
    run(kip, "class Exp:\n    def __init__(self):\n        self.best = {}\nexp = Exp()")
    cell = (
        "%%fresh_model -q\nresults = [build()]\nexp.best['first'] = exp.best.get('first', results)"
    )
    for _ in range(3):
        run(kip, cell)
    first = kip.user_ns["exp"].best["first"]
    assert first[0] is not None, "a model reachable through a kept object's attribute was cut"


def test_the_kept_walk_steps_over_numbers_and_strings() -> None:
    """A kept list of a million floats cost a million visits (~1 s per %%fresh_model cell);
    untracked objects hold no model, so the walk no longer visits them one by one."""
    from kerasmagic.walk import reachable

    data = [[float(i), str(i)] for i in range(10_000)]
    walk = reachable([("data", data)], (), max_visits=10_001)
    assert walk.complete and id(data[0]) in walk.objects  # the lists are walked, not the items


def test_models_in_a_kept_object_array_count_as_kept(kip: InteractiveShell) -> None:
    """A results table (a NumPy array of objects, what a pandas column is made of) keeps its
    models: the garbage collector does not see into it, so the walk looked past it and the
    report said "NOT freed: model (held by a function closure, ...)"."""
    from kerasmagic.cleanup import last_report

    run(kip, "import numpy as np\ntable = np.empty((1, 2), dtype=object)")
    cell = "%%fresh_model -q\nmodel = build()\ntable[0, len(table.nonzero()[0]) % 2] = model"
    for _ in range(3):
        run(kip, cell)
    report = last_report()
    assert report is not None and not report.not_freed, report.not_freed
    assert any("table.flat[" in alive for alive in report.kept), report.kept
    assert all(m is not None for m in kip.user_ns["table"].flat)


OUTSIDE_HOLDERS = {
    "clo = (lambda m: (lambda: m))(model)": "a function closure",
    "class Holder:\n    pass\nHolder.m = model": "an attribute of class Holder",
    "import types, sys\nsys.modules['usermod'] = types.ModuleType('usermod')\n"
    "sys.modules['usermod'].m = model": "a global of module usermod",
}


@pytest.mark.parametrize("hold", OUTSIDE_HOLDERS)
def test_a_model_held_from_outside_the_namespace_names_that_holder_only(
    kip: InteractiveShell, hold: str
) -> None:
    """A survivor's holders were its own insides too ("a function closure, a dict outside the
    namespace, a dict outside the namespace" for a Keras model only a module kept)."""
    from kerasmagic.cleanup import last_report

    run(kip, "model = build()\nmodel.fit(x, y, epochs=1, verbose=0)\n" + hold)
    run(kip, "%%fresh_model -q\nmodel = build()")
    report = last_report()
    try:
        assert report is not None
        assert report.not_freed == (f"model (held by {OUTSIDE_HOLDERS[hold]})",)
    finally:
        sys.modules.pop("usermod", None)


EARLIER_CELL_READS = {
    "a function": (
        "def keep_training(epochs):\n    model.fit(x, y, epochs=epochs, verbose=0)\n"
        "    return model",
        "model = keep_training(1)",
    ),
    "a function it calls": (
        "def current():\n    return model\ndef keep_training():\n    return current()",
        "model = keep_training()",
    ),
    "a method": (
        "class Trainer:\n    def resume(self):\n        return model\ntrainer = Trainer()",
        "model = trainer.resume()",
    ),
    "a lambda in a loop": ("resume = lambda: model", "for _ in range(2):\n    model = resume()"),
    "a decorated function": (
        "def logged(fn):\n    def wrapper(*args):\n        return fn(*args)\n    return wrapper\n"
        "@logged\ndef resume():\n    return model",
        "model = resume()",
    ),
    "a tf.function method": (
        "import tensorflow as tf\nclass Loop:\n    @tf.function\n    def step(self, v):\n"
        "        return model(v)\n    def run(self):\n        return self.step(x)\nloop = Loop()",
        "out = loop.run()\nmodel = build()",
    ),
    "a line magic": (
        "def evaluate():\n    return model.evaluate(x, y, verbose=0)",
        "%time evaluate()\nmodel = build()",
    ),
    "a tf.function": (
        "import tensorflow as tf\n@tf.function\ndef predict(v):\n    return model(v)",
        "out = predict(x)\nmodel = build()",
    ),
}


@pytest.mark.parametrize("case", EARLIER_CELL_READS)
def test_a_name_a_function_from_an_earlier_cell_reads_first_is_kept(
    kip: InteractiveShell, case: str, capsys: Any
) -> None:
    """``model = keep_training()`` with ``keep_training`` fitting the global ``model``: the
    model was dropped before the cell, the function failed with NameError, the model was lost."""
    define, cell = EARLIER_CELL_READS[case]
    run(kip, "model = build()\n" + define)
    before = kip.user_ns["model"]
    capsys.readouterr()
    result = kip.run_cell("%%fresh_model -q\n" + cell)
    assert result.error_in_exec is None, result.error_in_exec
    assert "NameError" not in "".join(capsys.readouterr())  # %time shows the error itself
    if "build()" not in cell:
        assert kip.user_ns["model"] is before, "the model the function read was dropped"


def test_a_function_reading_the_name_after_the_cell_rebinds_it_does_not_keep_it(
    kip: InteractiveShell,
) -> None:
    from kerasmagic.cleanup import last_report

    run(kip, "def evaluate():\n    return model.evaluate(x, y, verbose=0)\nmodel = build()")
    run(kip, "%%fresh_model -q\nmodel = build()\nevaluate()")
    report = last_report()
    assert report is not None and "model" in report.dropped


def test_a_rebound_object_array_lets_its_models_go(kip: InteractiveShell) -> None:
    run(kip, "import numpy as np")
    cell = "%%fresh_model -q\nmodels = np.array([build(), build()], dtype=object)"
    run(kip, cell)
    old = kip.user_ns["models"]
    run(kip, cell)
    assert list(old) == [None, None], "stale models stayed in a rebound object array"


def test_a_big_kept_object_array_is_walked_for_models_only() -> None:
    """A kept column of 20k token lists cost 20k visits per cleanup (2M: seconds); in an array
    that big only the models and callbacks stored in it are looked at."""
    import numpy as np

    from kerasmagic.walk import reachable

    class Model:
        pass

    column = np.empty(20_001, dtype=object)
    column[:-1] = [[str(i)] for i in range(20_000)]
    column[-1] = model = Model()
    walk = reachable([("column", column)], (Model,))
    assert id(model) in walk.models and len(walk.objects) < 10


def test_holders_of_a_survivor_never_run_user_code() -> None:
    from kerasmagic.cleanup.holders import referrer_kinds

    class Model:
        pass

    class Hostile:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            raise RuntimeError("no")

    model, holder, inside = Model(), Hostile(), Hostile()
    holder.__dict__["held"] = model  # a materialised attribute dict
    model.helper = inside  # type: ignore[attr-defined]
    assert referrer_kinds(model) == ["an attribute of a Hostile object"]


def test_unshared_rebound_container_is_still_cleared(kip: InteractiveShell) -> None:
    run(kip, "%%fresh_model -q\nresults = {'a': {'b': {'c': build()}}}")
    old = kip.user_ns["results"]
    run(kip, "%%fresh_model -q\nresults = {'a': {'b': {'c': build()}}}")
    assert old["a"]["b"]["c"] is None, "a stale model three levels into a rebound dict stayed"


CROSS_VALIDATION = """
%%fresh_model -q
for fold in range(2):
    model = build()
    h = model.fit(x, y, epochs=1, verbose=0)
    results["folds"].append({"fold": fold, "history": h})
"""


def test_history_deep_in_a_kept_log_lets_its_model_go(kip: InteractiveShell) -> None:
    """``results["folds"][i]["history"].model``, three levels down, kept every fold's model."""
    run(kip, 'import weakref\nresults = {"folds": []}')
    run(kip, CROSS_VALIDATION)
    run(kip, "first = weakref.ref(results['folds'][0]['history'].model)")
    run(kip, CROSS_VALIDATION.replace(" -q", ""))
    report = kip.user_ns["kerasmagic_report"] = __import__("kerasmagic").cleanup.last_report()
    assert "results['folds'][0]['history'].model" in report.dropped  # named by its path
    folds = kip.user_ns["results"]["folds"]
    assert kip.user_ns["first"]() is None, "a History deep in a kept log kept its model"
    assert [f["fold"] for f in folds] == [0, 1, 0, 1]
    assert all(f["history"].history["loss"] for f in folds), "the numbers must stay"
    assert folds[-1]["history"].model is kip.user_ns["model"]  # this run's link is its own


def test_one_history_under_many_names_is_reported_once(kip: InteractiveShell) -> None:
    run(kip, "h = build().fit(x, y, verbose=0)")
    run(kip, "h")  # Out[n], _ and _n: the same History
    run(kip, "%%fresh_model -q\nz = 1")
    report = __import__("kerasmagic").cleanup.last_report()
    assert [d for d in report.dropped if d.endswith(".model")] == ["h.model"]


TRAINER = """
%%fresh_model -q
alive_before_build = old() is not None
trainer = Trainer()
trainer.model.fit(x, y, epochs=1, verbose=0);
"""


def test_model_in_a_rebound_objects_attribute_goes_first(kip: InteractiveShell) -> None:
    """``trainer = Trainer()`` re-run: the old trainer's model used to live on into the cell."""
    run(
        kip,
        "import weakref\nclass Trainer:\n    def __init__(self):\n        self.model = build()\n",
    )
    run(kip, "trainer = Trainer()\nkeep = trainer\nold = weakref.ref(trainer.model)")
    run(kip, TRAINER)  # the old trainer is also kept as `keep`: never cut
    assert kip.user_ns["alive_before_build"] is True and kip.user_ns["keep"].model is not None
    run(kip, "del keep\nold = weakref.ref(trainer.model)")
    run(kip, TRAINER)
    assert kip.user_ns["alive_before_build"] is False, "the old trainer's model was not freed"
    assert kip.user_ns["trainer"].model is not None


def test_model_behind_a_filtered_traceback_is_freed(kip: InteractiveShell) -> None:
    """A callback that raises inside fit(): Keras filters its own frames out of the traceback,
    but the frames left in it still reach them (``f_back``), and fit's frame holds the model."""
    run(
        kip,
        "import weakref\nclass Boom(keras.callbacks.Callback):\n"
        "    def on_epoch_end(self, epoch, logs=None):\n        raise RuntimeError('boom')",
    )
    failed = kip.run_cell(
        "%%fresh_model -q\nmodel = build()\nmodel.fit(x, y, verbose=0, callbacks=[Boom()])",
        store_history=True,
    )
    assert isinstance(failed.error_in_exec, RuntimeError)
    del failed  # it holds the error too
    run(kip, "old = weakref.ref(model)")
    run(kip, "%%fresh_model -q\nmodel = build()")
    assert kip.user_ns["old"]() is None, "the traceback's hidden frames kept the model"
    assert sys.last_traceback is not None  # the error itself is kept for %tb


def test_model_whose_fit_failed_while_tracing_is_freed(kip: InteractiveShell) -> None:
    """A shape error while TensorFlow traced fit(): the stored error's frames run a function
    Keras made for that model alone, so clearing their locals is not enough (and the cleanup's
    own loop kept the last cut, the traceback, alive while it checked). The stored error goes."""
    run(kip, "import weakref")
    failed = kip.run_cell("%%fresh_model -q\nmodel = build()\nmodel.fit(x[:, :5], y)", True)
    assert isinstance(failed.error_in_exec, ValueError)
    del failed  # it holds the error too
    run(kip, "old = weakref.ref(model)")
    run(kip, "%%fresh_model -q\nmodel = build()\nstill_alive = old() is not None")
    assert kip.user_ns["still_alive"] is False, "the model of the failed trace survived"
    report = __import__("kerasmagic").cleanup.last_report()
    assert not report.not_freed and "dropped the stored error too" in report.summary()
    assert sys.last_traceback is None


# -- hostile objects -------------------------------------------------------------------------
HOSTILE = """
import weakref
class _Target: pass
_t = _Target()
dead = weakref.proxy(_t)
del _t
class LazyProxy:
    @property
    def __class__(self):
        raise RuntimeError("working outside of application context")
    def __getattr__(self, name):
        raise RuntimeError("working outside of application context")
class Anything:
    def __getattr__(self, name):
        return lambda *a, **k: self
class Slow:
    def __len__(self):
        import time; time.sleep(30)
        return 0
    def __iter__(self):
        import time; time.sleep(30)
        return iter(())
    def __eq__(self, other):
        raise RuntimeError("no eq")
    __hash__ = None
class BadList(list):
    def __iter__(self):
        raise RuntimeError("no iter")
    def __getitem__(self, i):
        raise RuntimeError("no getitem")
    def __len__(self):
        raise RuntimeError("no len")
lazy = LazyProxy()
anything = Anything()
slow = Slow()
bad = BadList([1, 2])
nested = {"p": dead, "l": [lazy, anything, slow], "b": bad}
"""


def test_hostile_objects_break_nothing(kip: InteractiveShell, capsys: Any) -> None:
    run(kip, HOSTILE)
    start = time.perf_counter()
    run(kip, "model = build()")
    kip.run_line_magic("gpu_mem", "")
    kip.run_line_magic("gpu_mem", "--deep")
    run(kip, "%%fresh_model\nmodel = build()")
    run(kip, "z = 1")
    elapsed = time.perf_counter() - start
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text and "failed" not in text and "Error" not in text, text
    assert "dropped model" in text
    assert elapsed < 25, "a slow user object was called"
    for name in ("dead", "lazy", "anything", "slow", "bad", "nested"):
        assert name in kip.user_ns


HOSTILE_HOLDERS = """
class Meta(type):
    def __getattribute__(cls, name):
        raise RuntimeError("metaclass says no")
class Guarded(metaclass=Meta):
    pass
class Slotted:
    __slots__ = ("model",)
class Odd:
    @property
    def __dict__(self):
        raise RuntimeError("no dict")
def holders():
    g, s, o = Guarded(), Slotted(), Odd()
    s.model = build()
    return {"g": g, "s": s, "o": o, "lazy": LazyProxy(), "any": Anything(), "dead": dead}
"""


def test_hostile_objects_holding_models_break_nothing(kip: InteractiveShell, capsys: Any) -> None:
    """Rebound and kept, deep in a log with a History: the walks that look into the user's
    objects and name deep holders judge them by type and their own dicts, never their code."""
    run(kip, HOSTILE + HOSTILE_HOLDERS)
    cell = (
        "%%fresh_model\nbox = holders()\n"
        "log = [{'deep': [holders(), build().fit(x, y, verbose=0)]}]"
    )
    for _ in range(2):
        run(kip, cell)
    kip.run_line_magic("gpu_mem", "--deep")
    text = "".join(capsys.readouterr())
    assert "Traceback" not in text and "Error" not in text and "failed" not in text, text
    assert "log[0]['deep'][1].model" in text  # the History's link, named by its path
    assert type(kip.user_ns["box"]["s"].model).__name__ == "Sequential"  # slots: left alone


def test_dead_proxy_in_a_stored_traceback(kip: InteractiveShell, capsys: Any) -> None:
    cell = (
        "import weakref\nclass _T: pass\n"
        "def fail():\n    t = _T(); p = weakref.proxy(t); del t\n    raise ValueError('boom')\n"
        "fail()"
    )
    kip.run_cell(cell, store_history=True)
    capsys.readouterr()
    for _ in range(2):
        run(kip, "%%fresh_model\nmodel = build()")
    text = capsys.readouterr().out
    assert text.count("kerasmagic: RSS ") == 2 and "ReferenceError" not in text


def test_hook_failure_is_one_line_once(ip: InteractiveShell, caplog: Any) -> None:
    monitor = get_monitor(ip)
    assert monitor is not None

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("probe broke")

    original = live_module.take_snapshot
    live_module.take_snapshot = broken  # type: ignore[assignment]
    try:
        for _ in range(3):
            ip.run_cell("z = 1")
    finally:
        live_module.take_snapshot = original  # type: ignore[assignment]
    warnings = [r for r in caplog.records if "probe broke" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None
    assert not monitor.sampler._running_cell, "the sampler stayed in cell mode"


# -- Ctrl-C ----------------------------------------------------------------------------------
INTERRUPT_IN_FINALIZER = """
class Bomb:
    def __del__(self):
        import os, signal
        os.kill(os.getpid(), signal.SIGINT)
model = build()
model._bomb = Bomb()
ran = 0
"""


def test_ctrl_c_during_cleanup_stops_the_cell(kip: InteractiveShell) -> None:
    run(kip, INTERRUPT_IN_FINALIZER)
    result = kip.run_cell("%%fresh_model -q\nmodel = build()\nran = 1", store_history=True)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert kip.user_ns["ran"] == 0, "the interrupted cell ran anyway"
    assert "x" in kip.user_ns and "build" in kip.user_ns
    assert "model" not in kip.user_ns  # it was about to be rebound: it stays dropped
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _interrupting(fn: Any) -> Any:
    def probe(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        return fn(*args, **kwargs)

    return probe


def test_ctrl_c_in_the_pre_cell_hook_stops_that_cell(ip: InteractiveShell, capsys: Any) -> None:
    ip.run_cell("ran = 0")
    original = live_module.read_ram
    live_module.read_ram = _interrupting(original)  # type: ignore[assignment]
    try:
        result = ip.run_cell("ran = 1", store_history=True)
    finally:
        live_module.read_ram = original  # type: ignore[assignment]
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert ip.user_ns["ran"] == 0
    assert "Error in callback" not in capsys.readouterr().out
    assert ip.run_cell("ran = 2").success and ip.user_ns["ran"] == 2  # the next cell is normal


def test_ctrl_c_in_the_post_cell_hook(ip: InteractiveShell, capsys: Any) -> None:
    monitor = get_monitor(ip)
    assert monitor is not None
    original = live_module.take_snapshot
    live_module.take_snapshot = _interrupting(original)  # type: ignore[assignment]
    try:
        result = ip.run_cell("ran = 1", store_history=True)
    finally:
        live_module.take_snapshot = original  # type: ignore[assignment]
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "Error in callback" not in capsys.readouterr().out
    assert not monitor.sampler._running_cell
    assert monitor.history()[-1].execution_count == result.execution_count


def test_ctrl_c_landing_in_a_gc_callback_still_stops_a_plain_cell(
    ip: InteractiveShell, capsys: Any
) -> None:
    """JAX's gc callback, TF's finalizers: an interrupt there used to be printed and dropped."""
    result = ip.run_cell(INTERRUPT_IN_GC_CALLBACK, store_history=True)
    assert isinstance(result.error_in_exec, KeyboardInterrupt), "the Ctrl-C was swallowed"
    assert "reached" not in ip.user_ns
    assert "Exception ignored" not in capsys.readouterr().err
    ip.run_line_magic("unload_ext", "kerasmagic")  # unloaded: Python's own behaviour is back
    try:
        result = ip.run_cell(INTERRUPT_IN_GC_CALLBACK, store_history=True)
        assert result.success and ip.user_ns["reached"] is True  # Python dropped it
    finally:
        ip.run_line_magic("load_ext", "kerasmagic")


def test_ctrl_c_in_a_finalizer_during_the_users_code(ip: InteractiveShell) -> None:
    ip.run_cell(
        "import os, signal\n"
        "class Bomb:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        for _ in range(1000):\n"
        "            pass\n"
        "bomb = Bomb()\nran = 0"
    )
    result = ip.run_cell("del bomb\nran = 1", store_history=True)  # the user's code, not ours
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert ip.user_ns["ran"] == 0


def test_ctrl_c_lost_in_c_code_without_a_traceback_still_stops_the_cell(
    ip: InteractiveShell,
) -> None:
    """A finalizer written in C hands over an interrupt with no Python frame of its own."""
    cell = (
        "import sys, types\n"
        "sys.unraisablehook(types.SimpleNamespace(exc_type=KeyboardInterrupt, "
        "exc_value=KeyboardInterrupt(), exc_traceback=None, err_msg=None, object=None))\n"
        "reached = True"
    )
    result = ip.run_cell(cell, store_history=True)
    assert isinstance(result.error_in_exec, KeyboardInterrupt), "the Ctrl-C was swallowed"
    assert "reached" not in ip.user_ns


def test_a_hook_wrapping_kerasmagics_still_gets_the_interrupt_raised(
    ip: InteractiveShell,
) -> None:
    seen: list[Any] = []
    ours = sys.unraisablehook

    def wrapper(unraisable: Any) -> None:  # another library's hook, installed after ours
        seen.append(unraisable.exc_type)
        ours(unraisable)

    sys.unraisablehook = wrapper
    try:
        result = ip.run_cell(INTERRUPT_IN_GC_CALLBACK, store_history=True)
    finally:
        sys.unraisablehook = ours
    assert seen == [KeyboardInterrupt]
    assert isinstance(result.error_in_exec, KeyboardInterrupt) and "reached" not in ip.user_ns


def test_a_caught_interrupt_leaves_the_frame_as_it_was(ip: InteractiveShell) -> None:
    """No tracer left behind, and the frame's trace flags back (pdb reads them later)."""
    cell = INTERRUPT_IN_GC_CALLBACK.replace(
        "    gc.collect()\n    reached = True\n",
        "    try:\n        gc.collect()\n        reached = True\n"
        "    except KeyboardInterrupt:\n        import sys\n"
        "        state = (sys.gettrace(), sys._getframe().f_trace_opcodes)\n",
    )
    assert ip.run_cell(cell).success
    assert ip.user_ns["state"] == (None, False) and "reached" not in ip.user_ns


def test_other_unraisable_exceptions_reach_the_previous_hook(ip: InteractiveShell) -> None:
    seen: list[Any] = []
    hook = sys.unraisablehook
    assert hook.__class__.__name__ == "RedeliverInterrupts"
    previous, hook.previous = hook.previous, seen.append  # type: ignore[attr-defined]
    try:
        ip.run_cell("class Bad:\n    def __del__(self): raise ValueError('x')\nBad()\n0")
        gc.collect()
    finally:
        hook.previous = previous  # type: ignore[attr-defined]
    assert [u.exc_type for u in seen] == [ValueError]


# -- load / unload ---------------------------------------------------------------------------
def _alive(type_name: str) -> int:
    return sum(1 for o in gc.get_objects() if type(o).__name__ == type_name)


def test_load_unload_cycles_leave_nothing_behind(ip: InteractiveShell) -> None:
    ip.run_line_magic("unload_ext", "kerasmagic")
    gc.collect()
    before = {name: _alive(name) for name in ("KerasMagics", "LiveMonitor", "Sampler")}
    hook = sys.unraisablehook
    for _ in range(20):
        ip.run_line_magic("load_ext", "kerasmagic")
        ip.run_line_magic("reload_ext", "kerasmagic")
        ip.run_cell("z = 1")
        ip.run_line_magic("unload_ext", "kerasmagic")
    gc.collect()
    after = {name: _alive(name) for name in before}
    assert after == before, f"left behind after unload: {after} (before {before})"
    samplers = [t for t in threading.enumerate() if t.name == "kerasmagic-sampler"]
    assert not samplers
    assert "fresh_model" not in ip.magics_manager.magics["cell"]
    assert sys.unraisablehook is hook, "the lost-interrupt hook stayed"
    ip.run_line_magic("load_ext", "kerasmagic")  # the fixture unloads it


@pytest.mark.parametrize("cycles", [3])
def test_reload_keeps_one_set_of_hooks(ip: InteractiveShell, cycles: int) -> None:
    for _ in range(cycles):
        ip.run_line_magic("reload_ext", "kerasmagic")
    hooks = [
        f
        for f in ip.events.callbacks["post_run_cell"]
        if getattr(f, "__qualname__", "").startswith("LiveMonitor")
    ]
    assert len(hooks) == 1


# -- PyTorch's grad mode after a Ctrl-C inside torch.no_grad().__enter__ --------------------
HALF_ENTERED = """
import torch
torch.no_grad().__enter__()  # what a Ctrl-C after its set_grad_enabled(False) leaves
raise KeyboardInterrupt
"""


def test_a_ctrl_c_inside_no_grad_enter_leaves_gradients_on(
    ip: InteractiveShell, capsys: Any
) -> None:
    torch = pytest.importorskip("torch")
    result = ip.run_cell(HALF_ENTERED)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert torch.is_grad_enabled()
    assert "left gradients off; they are on again" in capsys.readouterr().out
    run(ip, "torch.set_grad_enabled(False)")  # on purpose, in a cell that succeeds: kept
    assert not torch.is_grad_enabled()
    ip.run_cell("1 / 0")  # it was off before this cell: a failing cell leaves it off
    assert not torch.is_grad_enabled()
    torch.set_grad_enabled(True)


# -- TensorFlow's eager mode after a Ctrl-C in the finally that leaves graph mode ----------
def _interrupt_at(function: Any, line: str, when: Any = lambda frame: True) -> Any:
    """A trace function that raises KeyboardInterrupt once, where a Ctrl-C can land: as
    ``function`` (TensorFlow's) is about to run its source line containing ``line``."""
    import inspect

    code = inspect.unwrap(function)
    lines, first = inspect.getsourcelines(code)
    target = first + next(i for i, s in enumerate(lines) if line in s)
    fired: list[int] = []

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == target and when(frame) and not fired:
            fired.append(1)
            raise KeyboardInterrupt
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is code.__code__ else None

    return tracer


def _interrupt_as_tf_leaves_graph_mode() -> Any:
    """In ``Context._mode``'s ``finally``, before ``ctx.is_eager = old_is_eager``, as ``fit``'s
    first call finishes tracing its train step (the state CI met after a random Ctrl-C)."""
    from tensorflow.python.eager import context

    def leaving_graph_mode(frame: Any) -> bool:
        return bool(frame.f_locals.get("mode") == context.GRAPH_MODE)

    return _interrupt_at(context.Context._mode, "ctx.is_eager = old_is_eager", leaving_graph_mode)


def test_a_ctrl_c_as_tensorflow_leaves_graph_mode_leaves_it_eager(
    kip: InteractiveShell, capsys: Any
) -> None:
    import tensorflow as tf

    kip.user_ns["tracer"] = _interrupt_as_tf_leaves_graph_mode()
    cell = "import sys\nsys.settrace(tracer)\ntry:\n    build().fit(x, y, verbose=0)\nfinally:\n"
    result = kip.run_cell(cell + "    sys.settrace(None)", store_history=True)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    # Only a broken mode is put back and said: the line proves TF was left in graph mode.
    assert "left it there; eager execution is on again" in capsys.readouterr().out
    assert tf.executing_eagerly()
    run(kip, "model = build()\nmodel.fit(x, y, verbose=0)")  # before: RuntimeError, every time
    run(kip, "%%fresh_model -q\nmodel = build()\nmodel.fit(x, y, verbose=0)")


def _interrupt_as_tf_pops_a_context_switch() -> Any:
    """In ``Graph.as_default``'s ``finally``, before its ``context_switches.pop()`` (the block
    is over; its entry would stay)."""
    from tensorflow.python.framework import ops

    return _interrupt_at(ops._DefaultGraphStack.get_controller, "context_switches.pop()")


def _switches() -> int:
    from tensorflow.python.eager import context

    return len(context.context().context_switches.stack)


@pytest.mark.parametrize("caught", [False, True], ids=["failed", "caught-by-the-cell"])
def test_a_ctrl_c_as_a_graph_block_exits_leaves_no_context_switch_behind(
    kip: InteractiveShell, capsys: Any, caught: bool
) -> None:
    """The entry stayed for good: every later cell ran with a stale graph on TF's stack."""
    run(kip, "import tensorflow as tf")
    assert _switches() == 1
    kip.user_ns["tracer"] = _interrupt_as_tf_pops_a_context_switch()
    fit = "build().fit(x, y, verbose=0)"
    if caught:  # what a notebook's "stop training with Ctrl-C" cell does
        fit = f"try:\n        {fit}\n    except KeyboardInterrupt:\n        pass"
    cell = f"import sys\nsys.settrace(tracer)\ntry:\n    {fit}\nfinally:\n    sys.settrace(None)"
    result = kip.run_cell(cell, store_history=True)
    assert (result.error_in_exec is None) is caught, result.error_in_exec
    assert "left 1 entry on its stack of context switches" in capsys.readouterr().out
    assert _switches() == 1
    run(kip, "model = build()\nmodel.fit(x, y, verbose=0)")
    assert _switches() == 1 and "context switches" not in capsys.readouterr().out


def test_a_failed_cell_inside_a_graph_it_entered_is_left_as_it_is(
    kip: InteractiveShell, capsys: Any
) -> None:
    """Both stacks deeper than before: a block still open (here the user's own) undoes itself."""
    import tensorflow as tf

    result = kip.run_cell("g = tf.Graph()\nentered = g.as_default()\nentered.__enter__()\n1 / 0")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    said = capsys.readouterr().out
    assert not tf.executing_eagerly() and "eager execution is on" not in said
    assert _switches() == 2 and "context switches" not in said  # its entry: in use, kept
    run(kip, "entered.__exit__(None, None, None)")
    assert tf.executing_eagerly() and _switches() == 1
