"""``%gpu_mem --deep``'s model rows: a stored error's frames as one holder, and two models of
the same Keras name told apart."""

from __future__ import annotations

from kerasmagic.cleanup.holders import LiveModel
from kerasmagic.views.render import Table, model_rows

ERROR_REMEDY = "a stored traceback: Free memory clears it"
CACHE_REMEDY = "IPython's output cache: Free memory clears it"


def _model(name: str, holders: list[str], remedies: list[str]) -> LiveModel:
    return LiveModel(
        name, "Sequential", 744, tuple(holders), freeable=True, remedies=tuple(remedies)
    )


def test_a_model_held_by_eight_frames_of_the_stored_error_is_listed_once() -> None:
    frames = ["fit", "fit", "_fit", "train_step", "__call__", "call", "call", "error_handler"]
    holders = [f"sys.last_traceback ({fn}: self)" for fn in frames[:6]]
    holders += ["sys.last_value (call: model)", "sys.last_value (error_handler: model)"]
    model = _model(
        "sequential",
        ["Out[4]", *holders, "_4"],
        [CACHE_REMEDY] + [ERROR_REMEDY] * 8 + [CACHE_REMEDY],
    )
    ((label, text),) = model_rows([model])
    assert label == "sequential (Sequential)"
    assert "sys.last_" not in text, text
    assert text == (
        "weights 744 B; held by Out[4], _4 → IPython's output cache: Free memory clears it; "
        "the stored error (7 frames) → a stored traceback: Free memory clears it "
        "[Free memory frees it]"
    )


def test_one_frame_of_the_stored_error_keeps_its_name() -> None:
    model = _model("sequential", ["sys.last_traceback (fail: m)"], [ERROR_REMEDY])
    ((_, text),) = model_rows([model])
    assert "held by sys.last_traceback (fail: m) → a stored traceback" in text


def test_two_models_of_the_same_name_are_told_apart_by_their_holders() -> None:
    """After a reset Keras names again from `sequential`: two live models share the name."""
    rows = model_rows(
        [
            _model("sequential", ["model"], ["del model, or rebind it in a %%fresh_model cell"]),
            _model("sequential", ["Out[3]", "_"], [CACHE_REMEDY, CACHE_REMEDY]),
            _model("sequential_1", ["kept"], ["del kept, or rebind it in a %%fresh_model cell"]),
            _model("dense_model", ["a function closure"], ["not freed here"]),
            _model("dense_model", ["a function closure"], ["not freed here"]),
        ]
    )
    assert [label for label, _ in rows] == [
        "sequential (held as model) (Sequential)",
        "sequential (held as Out[3]) (Sequential)",
        "sequential_1 (Sequential)",
        "dense_model (held as a function closure) #1 (Sequential)",
        "dense_model (held as a function closure) #2 (Sequential)",
    ]
    assert len({label for label, _ in rows}) == len(rows)
    assert "sequential (held as model)" in repr(Table("live models", rows))
