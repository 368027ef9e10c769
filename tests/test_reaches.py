"""Every private structure kerasmagic reaches is probed where it runs, and none fails silently.

The self-check runs on every TensorFlow/Keras pair CI tests (docs/testing.md): each reach whose
module is imported must look as expected there. The others change a structure the way a new
release could (a seam: the module in ``sys.modules``, the class attribute, the object's own
``__dict__``) and check the one line, the feature turned off, and ``%gpu_mem``'s listing.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import run
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic.compat import registry as reaches  # the registry and its gate
from kerasmagic.compat.registry import REACHES

SHELL_LIBRARIES = ("ipython", "ipykernel")
pytestmark = pytest.mark.pair  # the self-check runs on every TensorFlow/Keras pair


@pytest.fixture(autouse=True)
def fresh_findings() -> Iterator[None]:
    """Each test probes from nothing, and leaves nothing found behind."""
    reaches.forget()
    yield
    reaches.forget()


def test_the_registry_names_each_reach_once_with_everything_said() -> None:
    names = [r.name for r in REACHES]
    assert len(names) == len(set(names)) >= 40
    for r in REACHES:
        assert r.access in ("read", "write"), r.name
        assert r.structure and r.feature and r.consequence and r.verified, r.name
        assert "\n" not in r.consequence and not r.consequence.endswith("."), r.name
        assert r.name.partition(".")[0].replace("_", "-") in r.library.replace("_", "-") or (
            r.name.partition(".")[0] in ("tf", "cpython")
        ), r.name


def _import_what_is_installed() -> list[str]:
    found = []
    for name in ("tensorflow", "keras", "tf_keras", "jax", "torch", "torch._dynamo", "ipywidgets"):
        try:
            importlib.import_module(name)
        except Exception:  # not installed here (the oldest venv has no JAX, say)
            continue
        found.append(name)
    return found


@pytest.mark.slow
def test_every_reach_looks_as_expected_on_this_stack(ip: InteractiveShell) -> None:
    """The self-check: on this TensorFlow, Keras, IPython (and JAX, PyTorch, tf-keras where
    installed), no reach is off."""
    _import_what_is_installed()
    found = reaches.check(ip, again=True)
    assert [f.line for f in found] == [] and reaches.off() == []
    imported = [r.name for r in REACHES if r.module in sys.modules]
    probed = [r.name for r in REACHES if r.name in reaches._results]
    kernel_only = {r.name for r in REACHES if r.library == "ipykernel"}
    assert set(imported) - set(probed) <= kernel_only, set(imported) - set(probed)
    if "keras" in sys.modules and "tensorflow" in sys.modules:
        assert {"keras.global_state", "tf.gradient_registry", "tf.debug_info"} <= set(probed)


def _reach(name: str) -> reaches.Reach:
    return next(r for r in REACHES if r.name == name)


FRAMEWORK_REACHES = [
    r.name for r in REACHES if r.library not in (*SHELL_LIBRARIES, "cpython", "glibc")
]


@pytest.mark.parametrize("name", FRAMEWORK_REACHES)
def test_a_module_that_lost_its_structure_is_found_off_never_passed(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a release does to the module (here: it keeps nothing), the probe says so."""
    reach = _reach(name)
    monkeypatch.setitem(sys.modules, reach.module, types.ModuleType(reach.module))
    found = reaches.probe(reach)
    assert found is not None, name
    assert found.line.startswith(f"kerasmagic: {reach.consequence}: {reach.library} ")
    assert "\n" not in found.line and f"(checked on {reach.verified})" in found.line


@pytest.mark.parametrize("name", [r.name for r in REACHES if r.library == "ipython"])
def test_a_shell_without_the_structure_is_found_off(name: str) -> None:
    found = reaches.probe(_reach(name), types.SimpleNamespace())
    if name == "ipython.cell_names":  # IPython 7 has no map: absent is expected there
        pytest.importorskip("IPython", minversion="8")
    assert found is not None, name


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Return the lines kerasmagic said about its reaches (a warning each; a kernel shows it)."""
    return [r.getMessage() for r in caplog.records if r.name == "kerasmagic.compat"]


def _off(name: str) -> reaches.Off | None:
    return next((o for o in reaches.off() if o.reach.name == name), None)


def gpu_mem_json(shell: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    run(shell, "%gpu_mem --json")
    out = capsys.readouterr().out
    return dict(json.loads(out[out.index("{") :]))


# -- the quiet cases the issue named: each now says its line and turns off its feature only --


def test_keras_global_state_moved_is_said_and_gpu_mem_lists_it(
    kip: InteractiveShell,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = "keras.src.backend.common.global_state"  # a release that moved it elsewhere:
    monkeypatch.setitem(sys.modules, path, types.ModuleType(path))  # Keras keeps its own
    kip.run_line_magic("unload_ext", "kerasmagic")
    reaches.forget()  # as in a new kernel: nothing probed yet
    kip.run_line_magic("load_ext", "kerasmagic")
    line = _off("keras.global_state")
    assert line is not None and said(caplog).count(line.line) == 1
    assert line.line.startswith(
        "kerasmagic: mixed-precision policy and random seed are not kept across %%fresh_model: "
        "keras "
    )
    run(kip, "keras.mixed_precision.set_global_policy('mixed_float16')")
    run(kip, "%%fresh_model -q\nm = build()")  # clear_session() runs, nothing is put back
    assert kip.user_ns["m"] is not None
    assert said(caplog).count(line.line) == 1  # said once, not again at each cleanup
    data = gpu_mem_json(kip, capsys)
    assert [o["reach"] for o in data["off"]] == ["keras.global_state", "keras.name_uids"]
    assert data["off"][0]["line"] == line.line
    if "tf_keras" not in sys.modules:  # (tf-keras's counter would still count)
        assert data["keras"]["name_counter"] is None  # its other feature: off too, and said
    run(kip, "keras.mixed_precision.set_global_policy('float32')")


def test_a_history_whose_model_link_moved_is_said_and_nothing_is_written(
    kip: InteractiveShell, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A release keeping the link elsewhere: the cut writes no ``model`` entry (Keras's
    property would hide it) and says why the old model stays."""
    callback = sys.modules["keras.src.callbacks.callback"].Callback

    def set_model(self: Any, model: Any) -> None:
        self._the_model = model

    monkeypatch.setattr(callback, "set_model", set_model)
    monkeypatch.setattr(callback, "model", property(lambda self: self._the_model))
    reaches.check(kip, again=True)
    found = _off("keras.callback_model")
    assert found is not None and found.found == "moved Callback._model"
    run(kip, "m = build()\nh = m.fit(x, y, epochs=1, verbose=0)")
    capsys.readouterr()
    run(kip, "%%fresh_model\nm = build()")
    out = capsys.readouterr().out
    history = kip.user_ns["h"]
    assert "model" not in vars(history)  # nothing written behind Keras's property
    assert vars(history)["_the_model"] is not None  # not cut: kerasmagic cannot know it
    assert "NOT freed" in out, out  # the old model stays, and the report says so


def test_a_kept_layer_without_outbound_nodes_is_said_and_nothing_is_unlinked(
    kip: InteractiveShell, caplog: pytest.LogCaptureFixture
) -> None:
    run(kip, "inp = keras.Input((20,))\nbase = keras.Model(inp, keras.layers.Dense(8)(inp))")
    run(kip, "head = keras.layers.Dense(2)(base.output)")
    layer = kip.user_ns["base"].layers[0]
    vars(layer).pop("_outbound_nodes")  # a release that keeps them elsewhere
    run(kip, "%%fresh_model -q\nhead = 1")
    found = _off("keras.outbound_nodes")
    assert found is not None and found.found == "moved Operation._outbound_nodes"
    assert said(caplog) == [found.line]
    assert found.line.startswith(
        "kerasmagic: dropped heads stay linked to kept base models (their weights stay): keras "
    )


def test_graph_debug_info_read_differently_keeps_tensorflows_own_traces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("tensorflow")
    from kerasmagic.backends.tensorflow import stack

    tf_stack = sys.modules["tensorflow.python.util.tf_stack"]
    real = tf_stack._tf_stack

    class Shifted:  # a TensorFlow whose GraphDebugInfo numbers its fields otherwise
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        def LoadTracesFromDebugInfo(data: bytes) -> Any:
            return real.LoadTracesFromDebugInfo(data.replace(b"\x10", b"\x18"))

    stack.uninstall()
    monkeypatch.setattr(tf_stack, "_tf_stack", Shifted())
    try:
        assert stack.install() is not None and not stack.installed()
        found = _off("tf.debug_info")
        assert found is not None and found.found == "reads GraphDebugInfo bytes differently"
    finally:
        monkeypatch.undo()
        reaches.forget()


def test_a_kernel_with_subshells_but_no_shell_parent_is_said_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("ipykernel.kernelbase")
    from kerasmagic.views.comm import send

    kernel = types.SimpleNamespace(shell_channel_thread=object())  # ipykernel 7, renamed
    shell = types.SimpleNamespace(kernel=kernel)
    assert reaches.probe(_reach("ipykernel.shell_parent"), shell) is not None
    reaches.check(shell)
    sent: list[Any] = []
    comm = types.SimpleNamespace(send=sent.append)
    send(comm, {"type": "sample"}, {"header": {}}, kernel)
    assert sent == [{"type": "sample"}]  # sent all the same, on the comm's own routing
    found = _off("ipykernel.shell_parent")
    assert found is not None and found.line.startswith(
        "kerasmagic: sidebar requests wait for the running cell: ipykernel "
    )


def test_a_module_still_importing_is_not_probed_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler thread asks while ``import tensorflow`` runs on the main thread: a module not
    done importing has not defined everything yet, and must not be found "moved"."""
    reach = _reach("tf.gradient_registry")
    half = types.ModuleType(reach.module)  # as a module looks mid-import: nothing defined yet
    half.__spec__ = types.SimpleNamespace(_initializing=True)  # type: ignore[assignment]
    monkeypatch.setitem(sys.modules, reach.module, half)
    monkeypatch.setitem(sys.modules, "tensorflow", half)
    assert reaches.works(reach.name) and reaches.check() == []
    assert reach.name not in reaches._results  # asked again once it is done
    assert reaches.ready(reach.module, finished=frozenset()) is False


@pytest.mark.slow
def test_in_a_real_kernel_nothing_is_off_and_nothing_is_said(tmp_path: Any) -> None:
    """A kernel whose sampler runs while TensorFlow imports, then a fit and %gpu_mem: every
    reach of this stack looks as expected, ipykernel's included, and no line was said."""
    from conftest import kernel_run, kernel_value, real_kernel

    cell = (
        "import numpy as np, keras\n"
        "m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])\n"
        "m.compile('adam', 'mse')\nh = m.fit(np.zeros((64, 4)), np.zeros((64, 2)), verbose=0)"
    )
    with real_kernel(str(tmp_path)) as (_, client):
        content, text = kernel_run(client, cell, timeout_s=180)
        assert content["status"] == "ok" and "kerasmagic" not in text, text
        content, text = kernel_run(client, "%%fresh_model -q\nm = None")
        assert content["status"] == "ok" and "kerasmagic" not in text, text
        off = kernel_value(
            client,
            "[o.line for o in __import__('kerasmagic.compat.registry').compat.registry.off()]",
        )
        probed = kernel_value(
            client, "sorted(__import__('kerasmagic.compat.registry').compat.registry._results)"
        )
    assert off == []
    assert {"tf.gradient_registry", "keras.global_state", "ipykernel.handler_hooks"} <= set(probed)


# -- each gate: the structure moved, the feature off (as IPython or Python has it), said once --


def test_a_kernel_whose_handler_hooks_moved_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """ipykernel renamed its handler hooks: the guard takes nothing over, Ctrl-C is ipykernel's."""
    kernelbase = pytest.importorskip("ipykernel.kernelbase")
    from kerasmagic.interrupts.guard import KernelGuard

    monkeypatch.delattr(kernelbase.Kernel, "pre_handler_hook")
    kernel = kernelbase.Kernel.__new__(kernelbase.Kernel)  # not started: nothing to run
    shell = types.SimpleNamespace(kernel=kernel, ast_transformers=[], events=None)
    state: Any = types.SimpleNamespace(shell=shell)
    assert KernelGuard.load(state) is None and KernelGuard.load(state) is None
    assert "pre_handler_hook" not in vars(kernel) and "post_handler_hook" not in vars(kernel)
    assert shell.ast_transformers == []
    found = _off("ipykernel.handler_hooks")
    assert found is not None and found.found == "moved Kernel.pre_handler_hook"
    assert said(caplog) == [found.line]
    assert found.line.startswith(
        "kerasmagic: a Ctrl-C just before or after a cell is left to ipykernel: ipykernel "
    )


def test_an_output_cache_that_moved_is_left_as_it_is(
    kip: InteractiveShell, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """IPython keeps its ``_``s elsewhere: the cleanup writes nothing on its display hook."""
    run(kip, "m = build()")
    run(kip, "m")  # shown: the display hook's _ holds it
    shown = kip.displayhook._
    assert shown is kip.user_ns["m"]
    monkeypatch.delattr(kip.displayhook, "___")  # a release without its three copies
    reaches.forget()  # as in a new kernel: nothing probed yet
    run(kip, "%%fresh_model -q\nm = build()")
    run(kip, "%%fresh_model -q\nm = build()")
    assert kip.displayhook._ is shown  # left as IPython has it: the old model stays there
    found = _off("ipython.output_cache")
    assert found is not None and said(caplog).count(found.line) == 1
    assert found.line.startswith("kerasmagic: models shown as a cell's value stay alive: ipython ")


def test_magics_that_moved_stay_registered_at_unload(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """IPython keeps its magics' registry otherwise: ``%unload_ext`` leaves the magics."""
    manager = ip.magics_manager
    moved = property(lambda self: types.MappingProxyType({}))  # not the dict kerasmagic edits
    monkeypatch.setattr(type(manager), "registry", moved)
    reaches.forget()
    ip.run_line_magic("unload_ext", "kerasmagic")
    assert "fresh_model" in manager.magics["cell"] and "gpu_mem" in manager.magics["line"]
    found = _off("ipython.magics")
    assert found is not None and said(caplog) == [found.line]
    assert found.line.startswith("kerasmagic: %unload_ext leaves the magics: ipython ")
    monkeypatch.undo()
    ip.run_line_magic("load_ext", "kerasmagic")  # the fixture unloads it again


def test_jax_and_torch_caches_that_moved_are_not_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """JAX's compilation cache and torch.compile's reset renamed: no count, no reset, one line
    each, however often they are asked."""
    from kerasmagic.backends import jax as jax_backend
    from kerasmagic.backends import torch as torch_backend

    pxla = types.ModuleType("jax._src.interpreters.pxla")
    pxla._cached_compilation = lambda: None  # type: ignore[attr-defined]  # no cache_info
    for name, module in (
        ("jax", types.ModuleType("jax")),
        ("jax._src.interpreters.pxla", pxla),
        ("torch", types.ModuleType("torch")),
        ("torch._dynamo", types.ModuleType("torch._dynamo")),  # no reset()
    ):
        monkeypatch.setitem(sys.modules, name, module)
    assert jax_backend.compiled_count() is None and jax_backend.compiled_count() is None
    assert torch_backend.reset() == [] and torch_backend.reset() == []
    jax_line, torch_line = _off("jax.compiled"), _off("torch.dynamo")
    assert jax_line is not None and torch_line is not None
    assert said(caplog) == [jax_line.line, torch_line.line]
    assert torch_line.line.startswith(
        "kerasmagic: torch.compile's caches are kept by %%fresh_model: torch "
    )


def test_a_python_without_getframe_names_the_cell_by_its_count(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``sys._getframe`` gone: no frame is read; the cell is the shell's count, said once."""
    from kerasmagic.cells.run import cell_number

    shell = types.SimpleNamespace(
        compile=types.SimpleNamespace(_filename_map={}), execution_count=7
    )
    with monkeypatch.context() as moved:
        moved.setattr(logging, "_srcfile", None)  # logging reads frames too, unless told not
        moved.setattr(sys, "_getframe", None)
        numbers = [cell_number(shell), cell_number(shell)]
    assert numbers == [7, 7]
    found = _off("cpython.frames")
    assert found is not None and found.found == "moved sys._getframe"
    assert said(caplog) == [found.line]
    assert found.line.startswith("kerasmagic: a Ctrl-C a library swallows is left to Python: ")
