"""Know before fit: ``predict_fit`` under TensorFlow's capped CPU allocator, and its refusals.

The capped run puts TF's CPU device on the BFC allocator a GPU uses, capped at 160 MB, in a
child process (the settings are read as TF starts). oneDNN's kernels are off there: with them,
TF 2.21's capped allocator crashes the process instead of raising (see ``tests/test_oom.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from conftest import kernel_run, kernel_value, real_kernel

import kerasmagic
from kerasmagic.oom.batch import FitPrediction
from kerasmagic.units import fmt_bytes

CAPPED = r"""
import json, os, random
import numpy as np, keras, tensorflow as tf
import kerasmagic
from kerasmagic.backends.oom import find_oom

keras.utils.set_random_seed(0)
x = np.random.rand(16384, 512).astype("float32")
y = np.random.randint(0, 10, 16384)
model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dropout(0.2), keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
small = dict(x=x[:8192], y=y[:8192], validation_split=0.1)
model.fit(batch_size=256, verbose=0, **small)
out = {}

def state():
    parts = [*model.variables, *model.optimizer.variables,
             *(v for m in model.metrics for v in m.variables)]
    return [v.numpy().tobytes() for v in parts]

def fit(batch, data=small):
    tf.config.experimental.reset_memory_stats("CPU:0")
    try:
        model.fit(batch_size=batch, verbose=0, **data)
    except Exception as error:
        if find_oom(error) is None:
            raise
        return "oom"
    return tf.config.experimental.get_memory_info("CPU:0")["peak"]

def predict(batch, data=small, **kw):
    p = kerasmagic.predict_fit(model, batch_size=batch, verbose=False, **data, **kw)
    return {"peak": p.peak_bytes, "fits": p.fits, "largest": p.largest_batch,
            "notes": list(p.notes), "probes": p.probes, "message": p.message}

# the model, its optimizer, metrics, compiled functions and RNG states as they were
before = state()
functions = (model.train_function, model.test_function, model.history)
keras.utils.set_random_seed(5)
reference = (tf.random.shuffle(tf.range(100)).numpy().tolist(), np.random.rand(), random.random())
keras.utils.set_random_seed(5)
out["fits"] = predict(1024)
after = (tf.random.shuffle(tf.range(100)).numpy().tolist(), np.random.rand(), random.random())
out["same_state"] = state() == before
out["same_functions"] = functions == (model.train_function, model.test_function, model.history)
out["same_rng"] = after == reference
out["fits_ran"] = fit(1024)

whole = dict(x=x, y=y, validation_split=0.1)
out["big"] = predict(12288, data=whole)
out["big_ran"] = fit(12288, data=whole)
out["largest"] = predict(12288, data=whole, margin=0.8)
out["largest_ran"] = fit(out["largest"]["largest"], data=whole)
# half of this batch alone would run out: the probes stop where the limit leaves no room
out["huge"] = predict(16384, data=dict(x=x, y=y))

# a tf.data.Dataset (rebatched to probe) and a PyDataset (its first batch, cut): their own batch
kept = state()
dataset = tf.data.Dataset.from_tensor_slices((x[:4096], y[:4096])).batch(1024)
out["dataset"] = predict(None, data=dict(x=dataset, validation_data=dataset.take(1)))

class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return x[i * 512 : (i + 1) * 512], y[i * 512 : (i + 1) * 512]

out["pydataset"] = predict(None, data=dict(x=Batches()))
out["tiny"] = predict(2)

class Subclassed(keras.Model):  # not built until called: the prediction builds it, as fit would
    def __init__(self):
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)

    def call(self, inputs):
        return self.out(self.hidden(inputs))

unbuilt = Subclassed()
unbuilt.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
p = kerasmagic.predict_fit(unbuilt, x[:2048], y[:2048], batch_size=256, verbose=False)
built = [v.numpy().tobytes() for v in unbuilt.variables]
history = unbuilt.fit(x[:2048], y[:2048], batch_size=256, verbose=0)
out["unbuilt"] = {"peak": p.peak_bytes, "message": p.message, "iterations_before_fit":
                  int(unbuilt.optimizer.iterations.numpy()) - 8, "weights": len(built)}
out["after_inputs"] = state() == kept

# %%fresh_model --predict: the line before the first step; a fit that would not fit stops
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

shell = InteractiveShell.instance()
shell.extension_manager.load_extension("kerasmagic")
shell.user_ns.update(model=model, x=x[:8192], y=y[:8192])
for batch in (1024, 6144):
    cell = f"h = model.fit(x, y, batch_size={batch}, validation_split=0.1, verbose=0)"
    with capture_output() as said:
        result = shell.run_cell(f"%%fresh_model --predict -q\n{cell}\n")
    error = result.error_in_exec
    out[f"cell_{batch}"] = {"said": said.stdout, "error": type(error).__name__ if error else None,
                            "fitted": "h" in shell.user_ns}
    shell.user_ns.pop("h", None)
# generators: each batch read once, all of them by the fit (the first read to probe, given back)
shell.run_cell("read = {'train': [], 'valid': []}\ndef batches(n, log):\n"
               "    for i in range(n):\n        read[log].append(i)\n"
               "        yield x[i * 64 : (i + 1) * 64], y[i * 64 : (i + 1) * 64]\n")
steps = int(model.optimizer.iterations.numpy())
cell = ("for fold in range(2):  # the second fit is like the first: run unpredicted\n"
        "    h = model.fit(batches(4, 'train'), steps_per_epoch=4, validation_steps=2,\n"
        "                  validation_data=batches(2, 'valid'), verbose=0)")
with capture_output() as said:
    result = shell.run_cell(f"%%fresh_model --predict -q\n{cell}\n")
out["cell_generator"] = {"said": said.stdout, "error": repr(result.error_in_exec),
                         "fitted": "h" in shell.user_ns, "read": shell.user_ns["read"],
                         "steps": int(model.optimizer.iterations.numpy()) - steps,
                         "history": sorted(shell.user_ns["h"].history) if "h" in shell.user_ns
                         else None}  # fmt: skip
# a K-fold loop: each fit like one already predicted to fit runs unpredicted and unsaid
shell.run_cell("import keras\ndef small():\n"
               "    m = keras.Sequential([keras.Input((512,)), keras.layers.Dense(64)])\n"
               "    m.compile('adam', 'mse')\n    return m\n")
cell = ("fits = 0\nfor batch in (256, 256, 512, 256):\n    m = small()\n"
        "    m.fit(x[:2048], x[:2048, :64], batch_size=batch, verbose=0)\n    fits += 1")
with capture_output() as said:
    result = shell.run_cell(f"%%fresh_model --predict -q\n{cell}\n")
out["cell_folds"] = {"said": said.stdout, "error": repr(result.error_in_exec),
                     "fits": shell.user_ns.get("fits")}
out["fit_unwrapped"] = "fit" not in vars(keras.Model)

print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def capped() -> dict[str, Any]:
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "160",
           "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", CAPPED], env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT") :])


def test_a_prediction_leaves_the_model_its_functions_and_rng_as_they_were(
    capped: dict[str, Any],
) -> None:
    assert capped["same_state"]  # weights, optimizer slots and step, metrics: byte for byte
    assert capped["same_functions"]
    assert capped["same_rng"]  # TF's op seeds (a seeded shuffle), numpy's and Python's


def test_a_fit_predicted_to_fit_runs_near_its_predicted_peak(capped: dict[str, Any]) -> None:
    fits = capped["fits"]
    assert fits["fits"] is True and isinstance(capped["fits_ran"], int)
    # On the CPU a fit's own peak varies from process to process by whole tensors (where the
    # allocator's free chunks fall): the accuracy figure is benchmarks/predict.py's; this holds
    # the prediction to the measured peak's neighbourhood, not to noise.
    assert abs(fits["peak"] - capped["fits_ran"]) <= 0.4 * capped["fits_ran"], fits["message"]
    assert max(b for b, _ in fits["probes"]) == 512  # half the batch


def test_a_fit_predicted_not_to_fit_runs_out_and_the_batch_named_runs(
    capped: dict[str, Any],
) -> None:
    big = capped["big"]
    assert big["fits"] is False and big["peak"] > 160 * 2**20, big["message"]
    said = flat(big["message"])
    assert "too big for 90% of it" in said and f"batch {big['largest']} fits" in said
    assert capped["big_ran"] == "oom"  # it does run out, at the size predicted
    largest = capped["largest"]["largest"]
    assert 1024 < largest < 12288
    assert isinstance(capped["largest_ran"], int) and capped["largest_ran"] < 160 * 2**20


def test_a_prediction_never_runs_out_of_memory_itself(capped: dict[str, Any]) -> None:
    for case in ("fits", "big", "largest", "huge"):
        assert not any("ran out" in note for note in capped[case]["notes"]), capped[case]
    huge = capped["huge"]
    assert max(b for b, _ in huge["probes"]) < 16384 // 2  # half the batch had no room
    assert huge["fits"] is False, huge["message"]


NO_ROOM = r"""
import json
import numpy as np, keras
import kerasmagic

model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(2048, activation="relu"),
                          keras.layers.Dense(1)])
model.compile("adam", "mse")
before = [v.numpy().tobytes() for v in model.variables]
out = {}
for rows in (40000, 20000):  # more than the cap; fit's copy of it (a 128 MB chunk) nearly fills it
    p = kerasmagic.predict_fit(model, np.zeros((rows, 1024), "float32"),
                               np.zeros((rows, 1), "float32"), batch_size=rows, verbose=False)
    out[rows] = {"fits": p.fits, "largest": p.largest_batch, "message": " ".join(p.message.split()),
                 "same": [v.numpy().tobytes() for v in model.variables] == before}
print("RESULT" + json.dumps(out))
"""


def test_a_fit_whose_arrays_or_smallest_probe_do_not_fit_is_said_to_run_out_without_a_crash() -> (
    None
):
    """TF's capped CPU allocator crashes the process (SIGSEGV) where a tensor made from NumPy
    runs out: the arrays fit copies are checked against what is free before any probe, and
    after a probe ran out its data is freed before the weights go back (both crashed before)."""
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "160",
           "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", NO_ROOM], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT")]
    assert run.returncode == 0 and lines, (run.returncode, run.stderr[-2000:])
    out = json.loads(lines[-1][len("RESULT") :])
    for rows, why in (("40000", "it copies its arrays (156.4 MB) into that allocator"),
                      ("20000", "a fit of batch 312 already did")):  # fmt: skip
        said = out[rows]
        assert said["fits"] is False and said["largest"] is None and said["same"], said
        assert f"fit of batch {rows} will run out of memory on CPU:0" in said["message"]
        assert f"{why}" in said["message"] and "no batch fits" in said["message"]


def test_fresh_model_predict_says_its_line_and_stops_a_fit_that_would_not_fit(
    capped: dict[str, Any],
) -> None:
    fits, big = capped["cell_1024"], capped["cell_6144"]
    assert fits["error"] is None and fits["fitted"]
    said = flat(fits["said"])
    assert "kerasmagic: fit of batch 1024 will peak at" in said and "): fits. " in said
    assert big["error"] == "MemoryError" and not big["fitted"]
    assert "too big for 90% of it" in flat(big["said"]) and "Not started." in flat(big["said"])
    assert "ResourceExhausted" not in big["said"]  # stopped before any step, not run out
    assert capped["fit_unwrapped"]  # Model.fit is Keras's own again after the cell
    # Generators: predicted from their first batch, which the fit then gets back: each fit read
    # every batch once, in order, for its 4 steps and 2 validation steps. The second fit, like
    # the first, was not predicted again.
    generators = capped["cell_generator"]
    assert generators["error"] == "None" and generators["fitted"], generators
    assert flat(generators["said"]).count("kerasmagic: fit of batch 64 will peak at") == 1
    assert generators["read"] == {"train": [0, 1, 2, 3] * 2, "valid": [0, 1] * 2}, generators
    assert generators["steps"] == 8 and "val_loss" in generators["history"], generators
    # A loop's fits: one line for each kind of fit, not for every fold (it printed four).
    folds = capped["cell_folds"]
    assert folds["error"] == "None" and folds["fits"] == 4, folds
    lines = [line for line in folds["said"].splitlines() if line.startswith("kerasmagic: fit of")]
    assert [line.split(" will ")[0] for line in lines] == [
        "kerasmagic: fit of batch 256",
        "kerasmagic: fit of batch 512",
    ], folds["said"]


def test_datasets_are_predicted_at_their_own_batch(capped: dict[str, Any]) -> None:
    for case, batch in (("dataset", 1024), ("pydataset", 512)):
        p = capped[case]
        assert p["fits"] is True and p["peak"] > 0, p["message"]
        assert f"fit of batch {batch} will peak" in flat(p["message"])
        assert "set_inter_op_parallelism_threads(1)" in flat(p["message"])  # TF's default: 0
        assert max(b for b, _ in p["probes"]) == batch // 2
    assert "The tf.data.Dataset is rebatched to probe" in flat(capped["dataset"]["message"])
    # the batch named is at most all the samples (their batches times their batch), as with
    # arrays: the room here is for about 4,000, a PyDataset of four batches of 512 holds 2,048
    assert capped["dataset"]["largest"] <= 4096 and capped["pydataset"]["largest"] == 2048
    tiny = capped["tiny"]
    assert tiny["peak"] is None and "a batch under 4 is as small as a probe" in flat(
        tiny["message"]
    )
    assert capped["after_inputs"]


def test_a_model_not_yet_built_is_built_as_fit_would_and_then_fits(
    capped: dict[str, Any],
) -> None:
    unbuilt = capped["unbuilt"]
    assert unbuilt["peak"] and unbuilt["weights"] == 4, unbuilt["message"]
    assert unbuilt["iterations_before_fit"] == 0  # the probes' steps were not counted


def test_a_probe_is_sized_by_the_highest_peak_measured_not_by_one_that_landed_low() -> None:
    """Recorded from CI's capped run: the probe of batch 539 landed 28 MB under the one of 347
    (its tensors in chunks already free). Read as a slope, that drop let the next probe jump
    straight to its target; a jump like it, to 6135, ran out of memory."""
    from kerasmagic.oom.batch import GROWTH, _room

    held, room = 22_677_760, 125_829_120
    peaks = {0: held, 347: 78_933_760, 539: 50_403_072}
    size = _room(peaks, 1536, room)
    assert size is not None and 539 < size < 1536
    worst = 78_933_760 + GROWTH * (78_933_760 - held) / 539 * (size - 539)
    assert worst <= room  # from the highest peak, at the slope from nothing to it
    # a step under a tenth of the largest probe is not worth a probe; the target always is
    assert _room({0: held, 2074: 125_006_336}, 6144, room) is None
    assert _room({0: held, 1000: 60_000_000}, 1050, room) == 1050


def test_with_room_for_one_probe_the_first_step_is_the_lines_other_end() -> None:
    """Recorded in a kernel capped at 160 MB: a 2048-wide MLP's weights and slots held 54 MB,
    its first step (batch 64 of 4096) peaked at 97 MB, and one probe had room. That used to be
    "cannot predict", and the fit then ran out of memory; now the two runs give the line."""
    from kerasmagic.oom.batch import Meter, _predicted

    mb = 2**20
    meter = Meter("CPU:0", lambda: None, lambda: 0, 160 * mb, "TF_CPU_BFC_MEM_LIMIT_IN_MB")
    first = tuple(int(v * mb) for v in (60.6, 97.4, 0, 60.3, 0))
    probe = tuple(int(v * mb) for v in (60.7, 99.1, 0, 60.3, 0))
    said = _predicted({0: [first], 86: [probe]}, 4096, meter, 0.9, (), 1.0)  # type: ignore[dict-item]
    assert said.peak_bytes is not None and said.fits is False and said.probes[0][0] == 64
    assert 60.3 * mb + 38.8 * mb + 1.7 * mb / 22 * 4010 == pytest.approx(said.peak_bytes, rel=0.01)
    assert "one probe, read with the first step" in flat(said.message)
    assert "probes reach batch 86 only, so this is rough: find_batch_size" in flat(said.message)
    # Its probes were 22 samples apart, 1.7 MB: less than the model's 2048x2048 kernel (16.8
    # MB) a step may hold more or less. With that kernel counted, the probes cannot tell (the
    # fit may run out, and runs), where without it they said it would not fit.
    unsure = _predicted({0: [first], 86: [probe]}, 4096, meter, 0.9, (), 1.0, chunk=2 * 16 * mb)  # type: ignore[dict-item]
    assert unsure.fits is None and unsure.peak_bytes == said.peak_bytes
    said_unsure = flat(unsure.message)
    assert "the probes cannot tell whether it fits 90% of it: it may run out" in said_unsure
    assert f"will peak at ~{fmt_bytes(unsure.least_bytes or 0)} to ~" in flat(unsure.message)
    assert repr(unsure).endswith(f"may not fit; largest batch {unsure.largest_batch})")
    none = _predicted({0: [first]}, 4096, meter, 0.9, (), 1.0)  # type: ignore[dict-item]
    assert none.peak_bytes is None and none.fits is None
    assert "one step of batch 64 peaked at 97.4 MB): it may run out" in flat(none.message)
    # A cell ending in predict_fit(...) shows the repr under the printed line: the figures, once.
    assert repr(said) == (
        f"FitPrediction(batch 4096: peak {fmt_bytes(said.peak_bytes)} on CPU:0, limit 160.0 MB, "
        f"does not fit; largest batch {said.largest_batch})"
    )
    assert repr(none) == "FitPrediction(batch 4096: not predicted)"


def test_one_probe_whose_step_held_a_tensor_more_does_not_steer_the_line() -> None:
    """Recorded under a 160 MB cap: a 512-2048-2048-10 MLP (weights and Adam slots 63 MB) had
    room to probe from batch 5 to 55; every probe's train step grew 42.1 MB over its start but
    the last, 58.9 MB: one 2048x2048 kernel's gradient more. Through the two ends that read as
    0.34 MB a sample, and a fit of 512 (which peaked at 131-144 MB) as 260 MB, too big. The
    median slope between every two probes is the probes' own: flat."""
    from kerasmagic.oom.batch import Meter, _predicted

    mb = 2**20
    meter = Meter("CPU:0", lambda: None, lambda: 0, 160 * mb, "TF_CPU_BFC_MEM_LIMIT_IN_MB")

    def run(train: float) -> tuple[int, ...]:
        return tuple(int(v * mb) for v in (71.8, 71.7 + train, 0, 71.7, 0))

    runs = {0: [run(42.1)], **{b: [run(42.1)] for b in (5, 7, 9, 13, 20, 30)}, 55: [run(58.9)]}
    said = _predicted(runs, 512, meter, 0.9, (), 1.0, chunk=2 * 16 * mb)  # type: ignore[arg-type]
    assert said.fits is True and said.peak_bytes == int(71.7 * mb) + int(58.9 * mb), said
    # Two probes a sample apart, 16.8 MB: the probes cannot tell (it read 8 GB, too big).
    close = {0: [run(42.1)], 9: [run(42.1)], 10: [run(58.9)]}
    unsure = _predicted(close, 512, meter, 0.9, (), 1.0, chunk=2 * 16 * mb)  # type: ignore[arg-type]
    assert unsure.fits is None and unsure.peak_bytes > 2**30
    assert unsure.least_bytes == said.peak_bytes
    # A line as steep with probes far enough apart that no tensor explains it: too big.
    steep = {0: [run(42.1)], 64: [run(42.1)], 256: [run(100.0)]}
    big = _predicted(steep, 512, meter, 0.9, (), 1.0, chunk=2 * 16 * mb)  # type: ignore[arg-type]
    assert big.fits is False and "too big for 90% of it" in flat(big.message)


NEAR = r"""
import json
import numpy as np, keras
import kerasmagic
from kerasmagic.oom.batch import device_meter

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(2048, activation="relu"),
                          keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(10)])
model.compile("adam", "sparse_categorical_crossentropy")
x, y = np.random.rand(4096, 512).astype("float32"), np.random.randint(0, 10, 4096)
said = [kerasmagic.predict_fit(model, x, y, batch_size=512, margin=1.0, verbose=False)
        for _ in range(3)]
meter = device_meter()
meter.reset()
model.fit(x, y, batch_size=512, verbose=0)
ran = meter.peak()
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
shell = InteractiveShell.instance()
shell.extension_manager.load_extension("kerasmagic")
shell.user_ns.update(model=model, np=np)
with capture_output() as folds:  # a K-fold loop of generator fits, as the user wrote it
    result = shell.run_cell("%%fresh_model --predict -q\nfits = 0\nfor fold in range(3):\n"
        "    model.fit(((np.random.rand(512, 512).astype('float32'), np.random.randint(0, 10, 512))"
        " for _ in range(4)), verbose=0)\n    fits += 1")
print("RESULT" + json.dumps({"fits": [p.fits for p in said], "ran": ran, "folds": folds.stdout,
                             "said": [p.message for p in said], "error": repr(result.error_in_exec),
                             "fitted": shell.user_ns.get("fits")}))
"""


@pytest.mark.slow
def test_a_fit_that_leaves_little_room_is_not_called_too_big() -> None:
    """Under a 160 MB cap, a model whose weights and Adam slots hold 63 MB leaves its probes
    room for batches of 5 to 55 only, where one kernel's gradient held or not moves a step's
    peak by 16.8 MB. Its fit of 512 runs, peaking at 126-151 MB of the 160 MB cap (CPU:0's
    parallel ops: the higher under load); before the median slope and the "cannot tell" band
    it was predicted at 0.2-8 GB, too big, in 2 of 3 predictions, and stopped in 9 of 17 kernel
    cells of generator fits. The predictions here take the whole cap as their budget, so a
    fit that runs is never rightly "too big"."""
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "160",
           "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", NEAR], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT") :])
    assert out["ran"] < 160 * 2**20  # the fit itself ran
    assert False not in out["fits"], out["said"]
    # In a --predict cell, a loop of three such fits all ran, predicted once: a fit that ran
    # is known for the rest of the cell, whether or not the probes could tell.
    assert out["error"] == "None" and out["fitted"] == 3, out
    assert flat(out["folds"]).count("kerasmagic: ") == 1, out["folds"]  # a fit's or no room's


def test_the_largest_batch_named_is_at_most_the_training_samples() -> None:
    """Recorded on an uncapped CPU: a 64-256-1 model's fit of 4,096 rows at 512 was named a
    largest batch of 9,223,967 against 21.7 GB of host RAM. A batch past the training samples
    is all of them, so the name stops there; a dataset's own size is not known, so it does not."""
    from kerasmagic.oom.batch import Meter, _fit_inputs, _predicted

    kb = 2**10
    meter = Meter("CPU:0", lambda: None, lambda: 0, 21 * 2**30, "host RAM available")
    small = tuple(int(v * kb) for v in (40, 300, 0, 20, 0))
    large = tuple(int(v * kb) for v in (40, 420, 0, 20, 0))
    runs = {0: [small], 64: [small], 256: [large]}
    rows = np.zeros((4096, 4), "float32")
    samples = _fit_inputs(rows, rows, 512, None, None, 0.25)[1]
    assert samples == 3072  # what validation_split leaves
    said = _predicted(runs, 512, meter, 0.9, (), 1.0, samples)  # type: ignore[arg-type]
    assert said.fits is True and said.largest_batch == 3072
    assert repr(said).endswith("fits; largest batch 3072)")
    # fit(batch_size=4096) with validation_split=0.1 runs batches of what the split leaves: the
    # line said "fit of batch 3686" to a user who asked for 4096
    whole = _predicted(runs, 3072, meter, 0.9, (), 1.0, samples)  # type: ignore[arg-type]
    assert whole.message.startswith("kerasmagic: fit of batch 3072 (all its training samples) ")
    assert "(all its" not in said.message
    # A fit predicted to fit is never named past the largest batch (it was named with 1.5 times
    # the slope and 90% of the margin): "fits; largest batch 369" for a batch of 512 read as a
    # contradiction. Here 420 KB + 0.625 KB a sample * 256 = 580 KB of a 585 KB budget.
    near = Meter("CPU:0", lambda: None, lambda: 0, 650 * kb, "given")
    close = _predicted(runs, 512, near, 0.9, (), 1.0, samples)  # type: ignore[arg-type]
    assert close.fits is True and close.largest_batch == 512, close
    unknown = _predicted(runs, 512, meter, 0.9, (), 1.0)  # type: ignore[arg-type]
    assert unknown.largest_batch is not None and unknown.largest_batch > 10**6
    # No growth measured (a dataset's fit): any batch fits, and the repr names none (it said
    # "largest batch None"); what is fixed past the limit: no batch fits.
    flat_runs = {0: [small], 64: [small], 256: [small]}
    anyway = _predicted(flat_runs, 512, meter, 0.9, (), 1.0)  # type: ignore[arg-type]
    assert anyway.largest_batch is None and repr(anyway).endswith(", fits)")
    tiny = Meter("CPU:0", lambda: None, lambda: 0, 100 * kb, "given")
    none = _predicted(runs, 512, tiny, 0.9, (), 1.0)  # type: ignore[arg-type]
    assert none.largest_batch is None and repr(none).endswith("does not fit; no batch fits)")


def test_on_a_cpu_without_tfs_bfc_allocator_the_line_says_what_its_figure_misses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC", raising=False)
    x = np.random.rand(256, 4).astype("float32")
    said = kerasmagic.predict_fit(_compiled(), x, x[:, :2], batch_size=64, verbose=False)
    assert "CPU:0's allocator misses tensors under 256 KB; set TF_CPU_ALLOCATOR_USE_BFC=true" in (
        flat(said.message)
    )


def test_a_fits_key_is_its_shapes_and_settings_and_none_where_not_known() -> None:
    """``--predict`` predicts a loop's fit once: two fits share a key only where their peaks
    would be the same. A value fit itself refuses (``batch_size=[64]``, unhashable) used to
    raise TypeError from the key, in place of Keras's own error; now such a fit is predicted
    (and its error left to ``fit``)."""
    from kerasmagic.oom.batch import _fit_key

    model, x = _compiled(), np.zeros((64, 4), "float32")
    same = _fit_key(model, {"x": x, "y": x[:, :2], "batch_size": 16})
    other_values = _fit_key(model, {"x": x + 1, "y": x[:, :2], "batch_size": 16})
    assert same is not None and same == other_values
    assert same != _fit_key(model, {"x": x, "y": x[:, :2], "batch_size": 32})
    assert same != _fit_key(model, {"x": x[:32], "y": x[:32, :2], "batch_size": 16})
    assert _fit_key(model, {"x": x, "y": x, "batch_size": [64]}) is None
    assert _fit_key(model, {"x": iter([x]), "batch_size": 16}) is None  # not arrays: not known


def flat(text: str) -> str:
    return " ".join(text.split())


def _compiled() -> Any:
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    return model


def test_a_fit_call_can_be_copied_whole() -> None:
    """``model.fit(...)`` renamed ``kerasmagic.predict_fit(model, ...)`` is taken as it is."""
    import inspect

    keras = pytest.importorskip("keras")
    fit = set(inspect.signature(keras.Model.fit).parameters) - {"self"}
    assert fit <= set(inspect.signature(kerasmagic.predict_fit).parameters)
    x, y = [[0.0] * 4] * 8, [[0.0] * 2] * 8
    said = kerasmagic.predict_fit(_compiled(), np.array(x), np.array(y), batch_size=4, epochs=5,
                                  initial_epoch=1, steps_per_epoch=2, validation_steps=1,
                                  validation_freq=2, verbose=False)  # fmt: skip
    assert said.batch_size == 4
    for bad in ({"epochs": "x"}, {"initial_epoch": -1}, {"steps_per_epoch": 0}):
        with pytest.raises(ValueError, match="must be a positive whole number"):
            kerasmagic.predict_fit(_compiled(), np.array(x), np.array(y), verbose=False, **bad)


def test_a_generator_is_refused_in_one_line_without_being_used_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import numpy as np

    batches = iter([(np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32"))] * 3)
    p = kerasmagic.predict_fit(_compiled(), batches)
    assert isinstance(p, FitPrediction) and p.peak_bytes is None and p.fits is None
    said = capsys.readouterr().out
    assert all(len(line) <= 80 for line in said.splitlines())  # wrapped at spaces, not by the page
    assert "generator cannot be probed" in flat(said)
    assert len(list(batches)) == 3
    # a validation generator is not probed either: its steps go uncounted, and it says so
    x, y = np.zeros((64, 4), "float32"), np.zeros((64, 2), "float32")
    validation = (batch for batch in [(x[:8], y[:8])] * 20)
    p = kerasmagic.predict_fit(_compiled(), x, y, batch_size=32, validation_data=validation)
    assert p.peak_bytes is not None
    assert "validation steps not counted" in flat(capsys.readouterr().out).lower()
    assert len(list(validation)) == 20


def test_bad_arguments_are_one_clear_error() -> None:
    import numpy as np

    x = np.zeros((8, 4), "float32")
    with pytest.raises(ValueError, match="compiled Keras model"):
        kerasmagic.predict_fit(object(), x)
    with pytest.raises(ValueError, match="batch_size must be a positive whole number"):
        kerasmagic.predict_fit(_compiled(), x, x, batch_size=0)
    with pytest.raises(ValueError, match="margin"):
        kerasmagic.predict_fit(_compiled(), x, x, margin=1.5)
    with pytest.raises(ValueError, match="limit_mb"):
        kerasmagic.predict_fit(_compiled(), x, x, limit_mb="lots")
    with pytest.raises(ValueError, match=r"margin must be in \(0, 1\], not 'most'"):
        kerasmagic.predict_fit(_compiled(), x, x, margin="most")
    with pytest.raises(ValueError, match=r"^x has no samples$"):
        kerasmagic.predict_fit(_compiled(), x[:0], x[:0], batch_size=4)
    with pytest.raises(ValueError, match=r"arrays .* found a NoneType$"):
        kerasmagic.predict_fit(_compiled(), None, x, batch_size=4)
    with pytest.raises(ValueError, match="validation_batch_size must be a positive whole"):
        kerasmagic.predict_fit(_compiled(), x, x, batch_size=4, validation_batch_size="8")
    with pytest.raises(ValueError, match="max_batch must be a positive whole number, not 0"):
        kerasmagic.find_batch_size(_compiled(), x, x, max_batch=0)
    # a dataset of single samples (scalar labels cannot be unbatched): fit fails on it too
    tf = pytest.importorskip("tensorflow")
    singles = tf.data.Dataset.from_tensor_slices((x, np.zeros(8, "float32")))
    with pytest.raises(ValueError, match=r"^x is a tf.data.Dataset of single samples, not b"):
        kerasmagic.predict_fit(_compiled(), singles)
    with pytest.raises(ValueError, match=r"^validation_data is a tf.data.Dataset of single"):
        kerasmagic.predict_fit(_compiled(), x, x, validation_data=singles)
    # the batch predicted is the one fit runs: no more than what validation_split leaves
    from kerasmagic.oom.batch import _fit_inputs

    rows = np.zeros((512, 4), "float32")
    assert _fit_inputs(rows, rows, 1024, None, None, 0.5)[0] == 256
    assert _fit_inputs(rows, rows, 1024, None, None, 0.0)[0] == 512
    assert _fit_inputs(rows, rows, 100, None, None, 0.5)[0] == 100
    # a batch from a NumPy grid is a batch, as fit takes it
    from kerasmagic.oom.batch import _whole

    assert _whole("batch_size", np.int64(32)) == 32 and type(_whole("b", np.int32(2))) is int


INTERRUPTED = """
import numpy as np, keras, kerasmagic

class CtrlC(keras.Sequential):  # run eagerly: a Ctrl-C lands in a step's Python, as in a fit
    steps, at = 0, 0
    def train_step(self, data):
        CtrlC.steps += 1
        if CtrlC.steps == CtrlC.at:
            raise KeyboardInterrupt
        return super().train_step(data)

model = CtrlC([keras.Input((16,)), keras.layers.Dense(32), keras.layers.Dense(2)])
model.compile("adam", "mse", run_eagerly=True)
x, y = np.random.rand(512, 16).astype("float32"), np.random.rand(512, 2).astype("float32")
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
state = lambda: [v.numpy().tobytes() for v in (*model.variables, *model.optimizer.variables)]
before, functions = state(), (model.train_function, model.history)
"""


def _interrupted_shell() -> tuple[Any, dict[str, Any]]:
    """An IPython shell that ran ``INTERRUPTED``, and its namespace (skips where nothing is
    probed)."""
    from IPython.core.interactiveshell import InteractiveShell

    pytest.importorskip("tensorflow")
    shell = InteractiveShell.instance()
    shell.run_cell(INTERRUPTED).raise_error()
    if isinstance(kerasmagic.oom.batch.device_meter(), str):
        pytest.skip("TensorFlow keeps no CPU allocator figures here: nothing is probed")
    return shell, shell.user_ns


def test_a_ctrl_c_mid_prediction_stops_it_and_leaves_model_and_namespace_as_they_were() -> None:
    """Ctrl-C while a probe trains (its third step: after the warm-up, mid-probe) reaches the
    user at once, as in a plain fit, with the model's weights, optimizer and functions put back;
    under ``%%fresh_model --predict`` the cell stops there, the fit never starts and the
    namespace keeps every value."""
    import gc

    shell, ns = _interrupted_shell()
    ns["CtrlC"].at = ns["CtrlC"].steps + 3
    frozen = gc.get_freeze_count()
    with pytest.raises(KeyboardInterrupt):
        kerasmagic.predict_fit(ns["model"], ns["x"], ns["y"], batch_size=256, verbose=False)
    assert ns["CtrlC"].steps == ns["CtrlC"].at  # it stopped where the Ctrl-C landed
    assert gc.get_freeze_count() == frozen  # the probes' freeze ended with them
    assert shell.run_cell("state() == before").result is True  # byte for byte
    assert shell.run_cell("functions == (model.train_function, model.history)").result is True

    shell.extension_manager.load_extension("kerasmagic")
    try:
        ns["CtrlC"].at = ns["CtrlC"].steps + 3
        cell = "%%fresh_model --predict -q\nh = model.fit(x, y, batch_size=256, verbose=0)\n"
        result = shell.run_cell(cell)
        assert isinstance(result.error_in_exec, KeyboardInterrupt)
        assert "h" not in ns and ns["CtrlC"].steps == ns["CtrlC"].at  # the fit never started
        assert shell.run_cell("state() == before").result is True
        assert all(name in ns for name in ("model", "x", "y", "before"))
        assert "fit" not in vars(ns["keras"].Model)  # Keras's own fit again
        shell.run_cell("h = model.fit(x, y, batch_size=256, verbose=0)").raise_error()
        assert ns["h"].history["loss"]  # the next fit runs as written
    finally:
        shell.extension_manager.unload_extension("kerasmagic")


def test_probes_collect_only_what_they_made_and_leave_the_collector_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What was alive before the prediction is frozen while the probes run (each probe's
    collection then walks only the probes' objects), and given back after; a freeze that was
    there already (a loop's, in the same cell) stays."""
    import gc

    from kerasmagic.cleanup.loops import Freezer

    _, ns = _interrupted_shell()
    seen, fit_peak = [], kerasmagic.oom.batch._fit_peak

    def probe(*args: Any, **kwargs: Any) -> Any:
        seen.append((Freezer.frozen, gc.get_freeze_count()))
        return fit_peak(*args, **kwargs)

    monkeypatch.setattr(kerasmagic.oom.batch, "_fit_peak", probe)
    before = gc.get_freeze_count()
    kerasmagic.predict_fit(ns["model"], ns["x"], ns["y"], batch_size=256, verbose=False)
    assert len(seen) >= 3 and all(frozen and count > before + 1000 for frozen, count in seen)
    assert gc.get_freeze_count() == before and not Freezer.frozen
    Freezer.freeze()  # as a loop's second model in a cell leaves it
    try:
        held = gc.get_freeze_count()
        kerasmagic.find_batch_size(ns["model"], ns["x"], ns["y"], verbose=False)
        assert Freezer.frozen and gc.get_freeze_count() == held
    finally:
        Freezer.thaw()


def test_a_ctrl_c_while_the_model_is_put_back_waits_until_all_of_it_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real SIGINT sent as the first weight is put back after the probes: the rest are put
    back too, and the interrupt reaches the user after them (without the hold, the weights
    after the first stayed as the probes left them)."""
    import signal

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's KeyboardInterrupt here")
    shell, ns = _interrupted_shell()
    shell.run_cell("before = state()").raise_error()
    probe, armed, sent = kerasmagic.oom.batch._probe, [False], []

    def probed(*args: Any, **kwargs: Any) -> Any:
        found = probe(*args, **kwargs)
        armed[0] = True  # what assigns a weight next is the put-back
        return found

    variable_class = type(ns["model"].variables[0])
    assign = variable_class.assign

    def assigned(self: Any, value: Any) -> Any:
        if armed[0] and not sent:
            sent.append(self)
            os.kill(os.getpid(), signal.SIGINT)
        return assign(self, value)

    monkeypatch.setattr(kerasmagic.oom.batch, "_probe", probed)
    monkeypatch.setattr(variable_class, "assign", assigned)
    with pytest.raises(KeyboardInterrupt):
        kerasmagic.predict_fit(ns["model"], ns["x"], ns["y"], batch_size=256, verbose=False)
    monkeypatch.undo()
    assert sent  # the SIGINT was sent during the put-back
    assert shell.run_cell("state() == before").result is True  # byte for byte


KERNEL_SETUP = """
import numpy as np, keras
x = np.random.rand(16384, 512).astype("float32")
y = np.random.randint(0, 10, 16384)
model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024, activation="relu"),
                          keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
"""


@pytest.mark.slow
def test_in_a_kernel_a_fit_too_big_is_stopped_and_the_batch_it_names_trains(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a user meets it: cells sent to a real kernel under a 160 MB capped allocator. The
    fit that would not fit stops before its first step with one line naming the batch that
    fits; the user's values stay; the same cell with that batch trains to the end."""
    # One inter-op thread, as the line itself advises: CPU:0's parallel ops move a fit's peak by
    # up to ~25% from run to run (a GPU's repeat). With two, this test failed once in 12 runs
    # (output not kept; the named batch's fit, predicted at 115-128 MB of 160, is the likeliest)
    for name, value in (("TF_CPU_ALLOCATOR_USE_BFC", "true"), ("TF_CPU_BFC_MEM_LIMIT_IN_MB", "160"),
                        ("TF_ENABLE_ONEDNN_OPTS", "0"),
                        ("TF_NUM_INTEROP_THREADS", "1")):  # fmt: skip
        monkeypatch.setenv(name, value)
    cell = "%%fresh_model --predict\nh = model.fit(x, y, batch_size={}, validation_split=0.1)\n"
    with real_kernel(str(tmp_path)) as (_, client):
        assert kernel_run(client, KERNEL_SETUP)[0]["status"] == "ok"
        content, text = kernel_run(client, cell.format(12288), 300)
        assert content["status"] == "error" and content["ename"] == "MemoryError", text
        said = flat(text)
        assert "fit of batch 12288 will peak at" in said and "Not started." in said, text
        assert "ResourceExhausted" not in text and "Epoch 1/1" not in text  # no step ran
        assert kernel_value(client, "[n in globals() for n in ('h', 'x', 'y', 'model')]") == [
            False, True, True, True]  # fmt: skip
        named = int(said.split("too big for 90% of it; batch ")[1].split()[0])
        assert 512 <= named < 12288, text
        content, text = kernel_run(client, cell.format(named), 600)
        assert content["status"] == "ok", text
        assert f"fit of batch {named} will peak at" in flat(text) and "): fits." in flat(text)
        assert kernel_value(client, "len(h.history['loss'])") == 1  # the whole epoch trained


def test_an_iterator_that_is_not_a_generator_reaches_fit_as_it_was(ip: Any) -> None:
    """Only a generator's first batch is read and handed back: Keras 3 refuses any other
    iterator, and made into a generator it would be taken, under ``--predict`` only."""
    pytest.importorskip("keras")
    ip.user_ns["m"] = _compiled()
    ip.user_ns["batches"] = iter([(np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32"))])
    result = ip.run_cell("%%fresh_model --predict -q\nm.fit(batches, verbose=0)")
    assert isinstance(result.error_in_exec, ValueError), result.error_in_exec
    assert "Unrecognized data type" in str(result.error_in_exec)


def test_a_ctrl_c_while_predicting_stops_the_cell_with_the_model_as_it_was(
    ip: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C among the probes stops the cell as one at a fit's start would: one line, no
    frame of the probes' (it showed ``predict_fit``, ``_probe`` and ``_fit_peak``), the fit not
    started and the model's weights as they were before the probes trained it."""
    from kerasmagic.oom import batch

    model, runs, real = _compiled(), [], batch._fit_peak

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        runs.append(args[3])
        if len(runs) == 2:  # the first probe's fit, after the first step's
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(batch, "_fit_peak", interrupted)
    before = [v.numpy().tobytes() for v in model.variables]
    x = np.random.rand(512, 4).astype("float32")
    ip.user_ns.update(m=model, x=x, y=x[:, :2])
    result = ip.run_cell("%%fresh_model --predict -q\nh = m.fit(x, y, batch_size=256, verbose=0)")
    error = result.error_in_exec
    assert isinstance(error, KeyboardInterrupt) and len(runs) == 2, (error, runs)
    assert (
        str(error)
        == "while kerasmagic predicted this fit: it did not start; the model is as it was"
    )
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert not {"predict_fit", "_probe", "_fit_peak"} & set(frames), frames
    assert error.__context__ is None  # the probes' frames are not kept behind it
    assert "h" not in ip.user_ns and [v.numpy().tobytes() for v in model.variables] == before
    assert "fit" not in vars(sys.modules["keras"].Model)


def test_a_fit_that_ran_is_not_predicted_again_in_the_cell(
    ip: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A K-fold loop's folds after one that ran are not predicted again, also where the probes
    could not tell (they were predicted, and their lines printed, fold after fold)."""
    from kerasmagic.oom import batch

    calls = []

    def unsure(*args: Any, **kwargs: Any) -> FitPrediction:
        calls.append(kwargs.get("batch_size"))
        mb = 2**20
        return FitPrediction(64, "CPU:0", 200 * mb, 160 * mb, least_bytes=100 * mb,
                             message="kerasmagic: the probes cannot tell")  # fmt: skip

    monkeypatch.setattr(batch, "predict_fit", unsure)
    x = np.random.rand(128, 4).astype("float32")
    ip.user_ns.update(m=_compiled(), x=x, y=x[:, :2])
    cell = (
        "fits = 0\nfor fold in range(3):\n    m.fit(x, y, batch_size=64, verbose=0)\n    fits += 1"
    )
    result = ip.run_cell(f"%%fresh_model --predict -q\n{cell}")
    assert result.error_in_exec is None and ip.user_ns["fits"] == 3
    assert calls == [64], calls


def test_an_empty_or_raising_generator_meets_fit_as_without_predict(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty generator reaches ``fit`` unpredicted and unsaid (it was told "a generator
    cannot be probed", then Keras's error); one that raises on its first batch shows its own
    frames, not kerasmagic's (a comprehension's frame in ``oom/batch.py`` showed)."""
    pytest.importorskip("keras")
    ip.user_ns.update(m=_compiled(), np=np)
    ip.run_cell(
        "def empty():\n    return\n    yield\ndef bad():\n    raise OSError('disk')\n    yield"
    )
    plain = ip.run_cell("m.fit(empty(), verbose=0)").error_in_exec  # Keras 3.15: ValueError,
    capsys.readouterr()  # 3.13 (Colab): IndexError
    result = ip.run_cell("%%fresh_model --predict -q\nm.fit(empty(), verbose=0)")
    assert type(result.error_in_exec) is type(plain) and plain is not None, result.error_in_exec
    assert str(result.error_in_exec) == str(plain)
    assert "kerasmagic" not in capsys.readouterr().out
    result = ip.run_cell("%%fresh_model --predict -q\nm.fit(bad(), verbose=0)")
    assert isinstance(result.error_in_exec, OSError), result.error_in_exec
    frames = []
    tb = result.error_in_exec.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    shown = [f.f_code.co_filename for f in frames if not f.f_locals.get("__tracebackhide__")]
    assert not [name for name in shown if "kerasmagic" in name], shown
    # A prediction that fails says why in its line, shortened: not a batch's whole repr.
    ip.run_cell("def rows():\n    yield np.zeros((8, 4), 'float32')")
    capsys.readouterr()
    ip.run_cell("%%fresh_model --predict -q\nm.fit(rows(), verbose=0)")
    out = capsys.readouterr().out  # the line, then Keras's error
    said = out[out.index("kerasmagic: ") : out.index("it runs as written")]
    assert said.startswith("kerasmagic: this fit was not predicted (ValueError: "), said
    assert "0. 0." not in said and len(said.splitlines()) <= 3, said


FIRST_CELL = r'''
import sys
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "kerasmagic")
assert "keras" not in sys.modules  # kerasmagic imports no Keras of its own
hooks = lambda: sum(type(f).__name__ == "AfterImport" for f in sys.meta_path)
before = hooks()
shell.run_cell("""%%fresh_model --predict -q
import numpy as np, keras
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
model.compile("adam", "mse")
h = model.fit(np.zeros((256, 8), "float32"), np.zeros((256, 4), "float32"), batch_size=64,
              verbose=0)
""").raise_error()
import keras
print("AFTER", "fit" in vars(keras.Model), type(keras.__spec__.loader).__name__,
      type(keras.__loader__).__name__, hooks() == before)
'''


def test_a_keras_first_imported_in_a_predicted_cell_has_its_fits_predicted() -> None:
    """Run All, or a notebook's first cell: Keras imported in the ``--predict`` cell itself. Its
    fit ran unpredicted and unsaid (``Model.fit`` was wrapped only where Keras was imported
    already); now Keras is wrapped as its import ends, and after the cell ``Model.fit``, the
    import system and Keras's loader are as they were."""
    pytest.importorskip("tensorflow")
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "3",
           "KERAS_BACKEND": "tensorflow"}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", FIRST_CELL], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "kerasmagic: fit of batch 64 will peak at" in flat(run.stdout), run.stdout
    after = next(line for line in run.stdout.splitlines() if line.startswith("AFTER"))
    assert after == "AFTER False SourceFileLoader SourceFileLoader True", after
