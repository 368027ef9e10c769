"""Pure units: cell parsing, the snapshot type, the import contract."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from typing import Any

import pytest

from kerasmagic.cells.rebinding import rebinding_in, rebound_now
from kerasmagic.snapshot import SCHEMA_VERSION, MemorySnapshot, diff, take_snapshot


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("model = build()\nmodel.fit(x)", {"model"}),
        ("model = model.fit()", set()),  # reads the old value first
        ("results += [1]", set()),
        ("a, (b, *c) = f()", {"a", "b", "c"}),
        ("print(m)\nm = 1", set()),
        ("if cond:\n    model = f()", set()),  # conditional: maybe not rebound
        ("with strategy.scope():\n    model = f()", {"model"}),
        ("h: History = m.fit()", {"h"}),
        ("x[0] = 1\nobj.attr = 2", set()),
        ("this is not python", set()),
    ],
)
def test_rebound_names(source: str, names: set[str]) -> None:
    try:
        tree = ast.parse(source)
    except SyntaxError:  # the magic refuses such a cell before anything is dropped
        tree = ast.Module(body=[], type_ignores=[])
    assert rebinding_in(tree).names == names


NOTEBOOK = """
import functools
def build():
    return object()
def current():
    return helper() or model
def helper():
    return current()
twice = functools.partial(functools.partial(current))
class Runs:
    @staticmethod
    def last():
        return model
    @property
    def best(self):
        return model
runs = Runs()
class Trainer:
    def __init__(self, fn):
        self.fn = fn
    def run(self):
        return self.fn()
trainer = Trainer(current)
class timed:
    def __init__(self, fn):
        self.fn = fn
    def __call__(self):
        return self.fn()
@timed
def timed_resume():
    return model
steps = {"resume": lambda: model}
with_callback = functools.partial(build, lambda: model)
def with_default(cb=current):
    return cb()
def batches():
    yield model
gen = batches()
"""


@pytest.mark.parametrize(
    ("cell", "names"),
    [
        ("model = build()", {"model"}),
        ("model = current()", set()),  # through a cycle of two functions
        ("model = twice()", set()),  # a partial of a partial
        ("model = Runs.last()", set()),  # a staticmethod
        ("model = runs.best", set()),  # a property of an object of a notebook class
        ("model = build()\ncurrent()", {"model"}),  # read only after the rebinding
        ("model = len('build')", {"model"}),  # builtins and strings read nothing
        ("model = trainer.run()", set()),  # a function kept in an object's attribute
        ("model = timed_resume()", set()),  # a class-based decorator
        ("model = steps['resume']()", set()),  # a lambda in a dict
        ("model = with_callback()", set()),  # a partial's argument
        ("model = with_default()", set()),  # a default argument
        ("model = next(gen)", set()),  # a generator's code
    ],
)
def test_what_earlier_cells_functions_read_counts_as_read(cell: str, names: set[str]) -> None:
    ns: dict[str, object] = {}
    exec(NOTEBOOK, ns)
    assert rebound_now(ns, rebinding_in(ast.parse(cell))) == names


def test_a_failing_read_walk_keeps_the_names_it_had_not_decided(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever goes wrong in the walk, the cell still runs and nothing undecided is dropped."""
    from kerasmagic import walk as near

    def broken(code: object) -> frozenset[str]:
        raise RuntimeError("an object no walk foresaw")

    monkeypatch.setattr(near, "_globals_of", broken)
    ns: dict[str, object] = {}
    exec(NOTEBOOK, ns)
    cell = "model = 1\nbest = current()\nhistory = 2"
    assert rebound_now(ns, rebinding_in(ast.parse(cell))) == {"model"}


def test_snapshot_round_trips_through_json() -> None:
    snap = take_snapshot({})
    again = MemorySnapshot.from_dict(json.loads(snap.to_json()))
    assert again == snap and snap.to_dict()["version"] == SCHEMA_VERSION


def test_diff() -> None:
    a = take_snapshot({})
    block = bytearray(64 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    b = take_snapshot({})
    delta = diff(a, b)
    assert delta.rss_bytes > 60 * 2**20 and delta.elapsed_s >= 0
    assert delta.gpu_used_bytes is None or isinstance(delta.gpu_used_bytes, int)
    del block
    with pytest.raises(TypeError, match=r"diff\(\) takes two MemorySnapshots"):
        diff(a, b.to_dict())  # type: ignore[arg-type]


def test_import_touches_neither_tensorflow_nor_nvml() -> None:
    code = (
        "import sys, kerasmagic\n"
        "kerasmagic.take_snapshot(); kerasmagic.reset({})\n"
        "roots = ('tensorflow', 'keras', 'IPython')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in roots))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert (
        "pynvml"
        not in subprocess.run(
            [sys.executable, "-c", "import sys, kerasmagic; print(list(sys.modules))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )


def test_fast_model_count_agrees_with_the_path_walk() -> None:
    keras = pytest.importorskip("keras")
    from kerasmagic.walk import callback_types, count_models, model_types, scan_order, walk

    models = [keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]) for _ in range(4)]
    history = keras.callbacks.History()
    history.set_model(models[3])
    ns = {
        "a": models[0],
        "nested": [models[1], {"k": models[2]}, (models[0],)],
        "h": history,
        "Out": {3: models[0]},
        "numbers": list(range(10_000)),
    }
    walked = {
        id(obj)
        for name in scan_order(ns)
        for _, obj, _ in walk(name, ns.get(name), callback_types())
        if isinstance(obj, model_types())
    }
    assert count_models(ns) == len(walked) == 4


def test_the_model_count_sees_a_model_kept_on_the_users_own_object() -> None:
    """``trainer.model`` is the common way a notebook keeps a model: %gpu_mem, the widget and the
    sidebar counted 3 of a notebook's 5 live models when two were held so."""
    keras = pytest.importorskip("keras")
    from types import SimpleNamespace

    from kerasmagic.walk import count_models

    class Trainer:
        def __init__(self, model: object) -> None:
            self.model, self.notes = model, ["kept"]

    models = [keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]) for _ in range(3)]
    ns = {
        "t": Trainer(models[0]),
        "runs": [Trainer(models[1])],
        "cfg": SimpleNamespace(m=models[2]),
    }
    assert count_models(ns) == 3
    ns["deep"] = [[Trainer(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]))]]
    assert count_models(ns) == 3  # three levels in: past the count's reach, as for containers


def test_counts_read_as_english() -> None:
    from kerasmagic.views.render import _opt

    assert _opt(1, "live models in the namespace") == "1 live model in the namespace"
    assert _opt(3, "live models in the namespace") == "3 live models in the namespace"
    assert _opt(1, "auto-named layers (name counter)") == "1 auto-named layer (name counter)"
    assert _opt(None, "traced functions") is None


def test_a_change_reads_as_the_sidebar_writes_it() -> None:
    """Badge, report line and sidebar (``formatDelta``) write a change alike: CI once saw a cell
    whose RSS did not move read "RSS 0 B" in its report line and "+0 B" on its badge."""
    from kerasmagic.units import signed_bytes

    assert [signed_bytes(n) for n in (2**20, 0, -3 * 2**10, None)] == [
        "+1.0 MB", "0 B", "-3.0 KB", "n/a"]  # fmt: skip


def test_as_dict_returns_what_dataclasses_asdict_returns() -> None:
    """The snapshot's fast ``as_dict`` (serialised after every cell) equals ``asdict``."""
    import dataclasses

    from kerasmagic.snapshot import as_dict

    @dataclasses.dataclass
    class Leaf:
        n: int
        s: str | None
        f: float = 0.5

    @dataclasses.dataclass
    class Tree:
        leaves: list[Leaf]
        pair: tuple[Leaf, int]
        by_name: dict[str, Leaf]
        tags: set[str]

    tree = Tree([Leaf(1, "a")], (Leaf(2, None), 3), {"x": Leaf(4, "b", 1e300)}, {"t"})
    snap = take_snapshot()
    delta = diff(snap, take_snapshot())
    for obj in (tree, snap, *snap.backends, delta):
        assert as_dict(obj) == dataclasses.asdict(obj)
    copied = as_dict(tree)
    assert copied["tags"] is not tree.tags and copied["leaves"] is not tree.leaves
    assert type(copied["pair"]) is tuple and copied["pair"][0] == {"n": 2, "s": None, "f": 0.5}


def test_a_post_import_hook_runs_after_the_module_and_goes_away(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import importlib.machinery
    import inspect

    from kerasmagic.imports import AfterImport

    (tmp_path / "km_hooked.py").write_text("VALUE = 41\n")
    (tmp_path / "km_failing.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    hook = AfterImport(["km_hooked"], lambda: seen.append(sys.modules["km_hooked"].VALUE))

    def broken() -> None:
        raise RuntimeError("the hook's own bug")

    failing = AfterImport(["km_failing"], broken)
    hook.install()
    failing.install()
    try:
        import km_failing  # type: ignore[import-not-found]
        import km_hooked  # type: ignore[import-not-found]
    finally:
        hook.uninstall()
        failing.uninstall()
        sys.modules.pop("km_hooked", None)
        sys.modules.pop("km_failing", None)
    assert seen == [41]  # after the module ran, once
    assert km_failing.VALUE == 1  # a failing hook is a warning, never a failed import
    assert "post-import hook failed" in caplog.text
    assert isinstance(km_hooked.__loader__, importlib.machinery.SourceFileLoader)
    assert km_hooked.__spec__.loader is km_hooked.__loader__
    assert "VALUE = 41" in inspect.getsource(km_hooked)
    assert hook not in sys.meta_path and failing not in sys.meta_path


def test_an_error_importing_a_hooked_module_shows_the_modules_frames_only(
    ip: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C or an error during ``import tensorflow`` reads as it does without kerasmagic:
    the loader that runs the hook afterwards is hidden, as IPython hides its own wrappers."""
    from kerasmagic.imports import AfterImport

    (tmp_path / "km_stopped.py").write_text("VALUE = 1\nraise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hook = AfterImport(["km_stopped"], lambda: None)
    hook.install()
    try:
        result = ip.run_cell("import km_stopped")
    finally:
        hook.uninstall()
        sys.modules.pop("km_stopped", None)
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "km_stopped.py" in shown and "raise KeyboardInterrupt" in shown  # IPython 7 and 8+
    assert "[... skipping hidden 1 frame]" in shown
    assert "kerasmagic/" not in shown, shown


class _Model:
    """Stands for a model class: the near walk judges objects by type alone."""


class _Callback:
    """Stands for a callback class: its ``.model`` link is followed, never walked into."""

    def __init__(self, model: Any) -> None:
        self.model = model


def test_a_plan_walks_each_object_near_the_namespace_once(monkeypatch: Any) -> None:
    """``model``, ``Out[3]``, ``_3`` and ``_`` holding one container: one walk, each path its
    own; a callback's linked model is not state found in the container (its link is cut)."""
    from kerasmagic import walk as near

    walked: list[int] = []
    real = near.walk

    def counting(path: str, obj: Any, *rest: Any) -> Any:
        if path == "":
            walked.append(id(obj))
        return real(path, obj, *rest)

    monkeypatch.setattr(near, "walk", counting)
    model, linked = _Model(), _Model()
    callback = _Callback(linked)
    runs = {"cv": [model, callback]}
    walks = near.NearWalks((_Callback,))
    for path in ("runs", "Out[3]", "_3", "_"):
        assert walks.state(path, runs, (_Model,)) == [(f"{path}['cv'][0]", model)]
        assert walks.state(path, runs, (_Callback,)) == [(f"{path}['cv'][1]", callback)]
    assert walked == [id(runs)]
    assert list(real("runs", runs, (_Callback,)))[-1] == ("runs['cv'][1].model", linked, True)
