"""Review findings: each test fails on the code as reviewed and shows how a user hits the bug."""

from __future__ import annotations

import gc

from conftest import run
from IPython.core.interactiveshell import InteractiveShell
from shared_cells import TRAIN_STEP

from kerasmagic.cleanup.loops import STARTUP_FROZEN, Freezer

TWO_MODELS = """
for fold in range(2):
    model = build()
    history = model.fit(x, y, epochs=1, batch_size=128, verbose=0)
"""


def test_a_users_own_gc_freeze_survives_a_loop_cell(kip: InteractiveShell) -> None:
    """Users call ``gc.freeze()`` after loading big data so collections skip it. The loop
    guard's thaw at the cell's end calls ``gc.unfreeze()``, which unfreezes everything,
    the user's frozen objects too."""
    run(kip, "import gc\ngc.freeze()\nfrozen = gc.get_freeze_count()")
    frozen = kip.user_ns["frozen"]
    try:
        run(kip, TWO_MODELS)
        assert not Freezer.frozen
        # frozen objects that die by refcount leave the count; the user's freeze must stay
        assert gc.get_freeze_count() > frozen // 2, (gc.get_freeze_count(), frozen)
    finally:
        gc.unfreeze()


STEP = (
    TRAIN_STEP
    + """

class Trainer:
    def __init__(self, step):
        self.step = step
"""
)


def test_a_tf_function_in_an_attribute_of_a_kept_object_forgets_dropped_models(
    kip: InteractiveShell,
) -> None:
    """README: tf.functions are found "under your names, one level into containers and
    objects". On Python 3.11+ an object's attributes live inline until its ``__dict__`` is
    asked for, and ``gc.get_referents`` then shows the values, not a dict: the walk
    (``walk.state.attributes``) finds no attribute, and ``trainer.step`` keeps a trace (a graph
    and the variables) of every dropped model."""
    run(kip, STEP + "trainer = Trainer(train_step)\ndel train_step")
    for _ in range(3):
        run(kip, "%%fresh_model -q\nmodel, opt = fresh_pair()\n"
            "loss = float(trainer.step(model, opt, x, y))")  # fmt: skip
    assert kip.user_ns["trainer"].step.experimental_get_tracing_count() == 1


TRAINER = """
class Trainer:
    def __init__(self):
        self.model = build()
    def predict(self, data):
        return self.model.predict(data, verbose=0)
"""


def test_a_kept_bound_method_keeps_its_object_whole(kip: InteractiveShell) -> None:
    """``predict = trainer.predict`` keeps the old trainer (``paths_to`` even names that path),
    but the kept-names walk treats bound methods as opaque: re-running ``trainer = Trainer()``
    with ``%%fresh_model`` sets the old trainer's ``.model`` to None and the kept ``predict``
    breaks with ``'NoneType' object has no attribute 'predict'``."""
    run(kip, TRAINER + "trainer = Trainer()\npredict = trainer.predict")
    run(kip, "%%fresh_model -q\ntrainer = Trainer()")
    assert run(kip, "predict(x).shape") == (256, 2)


def test_a_model_trained_outside_a_cell_leaves_nothing_frozen(kip: InteractiveShell) -> None:
    """An ``ipywidgets`` callback (``interact_manual``, a button's ``on_click``), a silent
    execute request or a thread trains outside any cell: no ``post_run_cell`` follows, so
    the loop guard's ``gc.freeze()`` at the first optimizer build stays until some later cell
    ends (in a Voila dashboard, never), and every object alive then that dies later (the
    previous click's model) is never collected."""
    run(kip, "def train():\n    m = build()\n    m.fit(x, y, epochs=1, verbose=0)\n    return m")
    try:
        kip.user_ns["train"]()  # what a button's on_click runs: no cell around it
        assert not Freezer.frozen and gc.get_freeze_count() <= STARTUP_FROZEN
        kip.run_cell(TWO_MODELS, silent=True)  # a frontend's silent execute request
        assert not Freezer.frozen and gc.get_freeze_count() <= STARTUP_FROZEN
    finally:
        Freezer.thaw()


JAX_CELLS = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "kerasmagic")
build = "m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])"
shell.run_cell("import keras\\n" + build)
shell.run_cell("%%fresh_model -q\\n" + build)
from kerasmagic.cleanup import last_report
print(json.dumps({"notes": list(last_report().notes), "tf": "tensorflow" in sys.modules}))
"""


def test_a_jax_cell_is_not_told_about_tensorflows_internals() -> None:
    """On JAX (or PyTorch) TensorFlow is never imported, yet every ``%%fresh_model`` report
    ended in "TensorFlow's tf_stack internals not found; op stack traces left as they are"
    (the check that TF is imported was lost when the cleanup became named steps)."""
    from test_backends import python

    found = python(JAX_CELLS, KERAS_BACKEND="jax")
    assert not found["tf"]
    assert not [note for note in found["notes"] if "TensorFlow" in note], found["notes"]


NESTED = """
def make():
    i = keras.Input((20,))
    base = keras.Model(i, keras.layers.Dense(16)(i), name="base")
    inp = keras.Input((20,))
    full = keras.Model(inp, keras.layers.Dense(2)(base(inp)))
    full.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return full
full = make()
"""
OUTBOUND = (
    "[len(x._outbound_nodes) for x in full._flatten_layers(include_self=True, recursive=True)]"
)


def test_a_kept_model_keeps_the_nodes_of_a_model_nested_in_it(kip: InteractiveShell) -> None:
    """A kept model built with a nested model (a base called as a layer) keeps that call in its
    own graph. ``Plan.keeps`` never counts a model as owned, so ``_unlink_from_kept_layers``
    cut the kept model's own node to its nested base, and a cell that drops nothing reported
    "unlinked 1 dropped layer from the graphs of kept models"."""
    from kerasmagic.cleanup import last_report

    run(kip, NESTED)
    before = run(kip, OUTBOUND)
    run(kip, "%%fresh_model -q\nz = 1")
    notes = last_report().notes  # type: ignore[union-attr]
    assert not [note for note in notes if "unlinked" in note], notes
    assert run(kip, OUTBOUND) == before


def test_models_in_a_rebound_defaultdict_are_freed_before_the_cell(kip: InteractiveShell) -> None:
    """``models_under`` looks into dict and list subclasses (``defaultdict``, ``OrderedDict``),
    so the report says they were dropped, but ``strip`` only cuts exact ``dict``/``list``:
    the old models stay until the cell rebinds the name, and the report lists them as both
    dropped and not freed."""
    from kerasmagic.cleanup import last_report

    cell = (
        "from collections import defaultdict\n"
        "runs = defaultdict(list)\n"
        "for fold in range(2):\n"
        "    runs['models'].append(build())\n"
    )
    run(kip, cell)
    run(kip, "%%fresh_model -q\n" + cell)
    report = last_report()
    assert report is not None and report.dropped, report
    assert report.not_freed == (), report.not_freed


def test_a_rebound_slots_dataclass_lets_its_model_go_before_the_cell(kip: InteractiveShell) -> None:
    """README: models "in the attributes of a rebound object whose class is yours" go before
    the cell. ``@dataclass(slots=True)`` objects keep attributes in slots, not ``__dict__``:
    the plan never sees their model, so the old model is alive while the new one is built,
    and ``--all`` leaves it too."""
    run(kip, "import dataclasses, weakref\n@dataclasses.dataclass(slots=True)\n"
        "class Run:\n    model: object\n    score: float = 0.0\nrun_ = Run(build())\n"
        "old = weakref.ref(run_.model)")  # fmt: skip
    run(kip, "%%fresh_model -q\nalive = old() is not None\nrun_ = Run(build())")
    assert kip.user_ns["alive"] is False
    run(kip, "old = weakref.ref(run_.model)")
    run(kip, "%%fresh_model -q --all\nz = 1")
    assert kip.user_ns["old"]() is None


FROZEN_BEFORE_LOAD = """
import gc, json
import numpy as np, keras
data = [[i] for i in range(50_000)]
gc.freeze()  # before kerasmagic is imported: its module reads the count as it loads
frozen = gc.get_freeze_count()
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "kerasmagic")
shell.run_cell('''
x, y = np.zeros((64, 20), "float32"), np.zeros(64, "int64")
for fold in range(2):
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, verbose=0)
''')
print(json.dumps([frozen, gc.get_freeze_count()]))
"""


def test_a_freeze_made_before_the_extension_loaded_stays_the_users() -> None:
    """The startup count (Python 3.12 freezes a few hundred of its own objects) was read as
    kerasmagic loaded: a user's earlier freeze counted as Python's, and the loop guard's thaw
    at the cell's end unfroze it."""
    from test_backends import python

    frozen, after = python(FROZEN_BEFORE_LOAD, KERAS_BACKEND="tensorflow")
    assert frozen > 50_000 and after >= frozen * 0.9, (frozen, after)


ONE_CELL = """
import json
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "kerasmagic")
shell.run_cell('''
import numpy as np, keras
from kerasmagic.backends.tensorflow.graphs import custom_gradient_count
x, y = np.zeros((64, 20), "float32"), np.zeros(64, "int64")
counts = []
for fold in range(6):
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, verbose=0)
    counts.append(custom_gradient_count())
''')
print(json.dumps(shell.user_ns["counts"]))
"""


def test_a_loop_in_the_cell_that_first_imports_keras_stays_flat() -> None:
    """ "Loops need no cleanup code": but the optimizers' ``build`` is wrapped only at a cell's
    start once Keras is imported, so a notebook whose loop sits in the cell that imports Keras
    (a script pasted in one cell, Run All on a fresh kernel) keeps every fold's training graph
    in TF's gradient registry."""
    from test_backends import python

    counts = python(ONE_CELL, KERAS_BACKEND="tensorflow")
    # Flat from the third fold (the first fold's model waits for the cell's end: it existed at
    # the freeze), run after run: the wrap is installed as Keras's optimizers are imported,
    # not when a sampler next looks (which let one or two more folds in, by timing).
    assert counts[2:] == [counts[2]] * 4, counts
