"""Reset the Keras backend's global state.

``clear_session()`` resets names, graphs and kernel caches, and with them user settings kept in
the same global state (dtype policy, random seed): those are saved and put back. Then each
backend in use empties its own caches (``kerasmagic.backends``).
"""

from __future__ import annotations

import sys
from typing import Any

from kerasmagic.compat.reaches import broken, works

STATE = "keras.src.backend.common.global_state"

# Keras keeps user settings in the same global state that clear_session() throws away.
KERAS_SETTINGS = (
    "dtype_policy",  # keras.mixed_precision.set_global_policy("mixed_float16")
    "global_random_seed",  # keras.utils.set_random_seed(...)
    "interactive_logging",
    "traceback_filtering",
    "flash_attention",
    "nnx_enabled",
)


def _keras_settings() -> dict[str, Any]:
    """Return Keras's user settings to put back after ``clear_session()``; {} when its global
    state moved (said once: ``compat.reaches``)."""
    state = sys.modules.get(STATE)
    if state is None or not works("keras.global_state"):
        return {}
    try:
        values = {name: state.get_global_attribute(name) for name in KERAS_SETTINGS}
    except Exception as exc:
        broken("keras.global_state", f"changed get_global_attribute ({type(exc).__name__})")
        return {}
    saved = {name: value for name, value in values.items() if value is not None}
    if "dtype_policy" not in saved and _public_policy() not in (None, "float32"):
        broken("keras.global_state", "keeps the dtype policy elsewhere than 'dtype_policy'")
    return saved


def _public_policy() -> str | None:
    """Return the global dtype policy's name through Keras's public API, or None."""
    config = getattr(sys.modules.get("keras"), "config", None)
    read = getattr(config, "dtype_policy", None)
    try:
        return None if read is None else str(read().name)
    except Exception:  # a Keras without it: nothing to compare with
        return None


def _restore_keras_settings(saved: dict[str, Any]) -> None:
    state = sys.modules.get(STATE)
    if not saved or state is None:
        return
    try:
        for name, value in saved.items():
            state.set_global_attribute(name, value)
    except Exception as exc:
        broken("keras.global_state", f"changed set_global_attribute ({type(exc).__name__})")


def reset_backend() -> list[str]:
    """Reset Keras's global state (names, graphs, kernel caches), keep its user settings, then
    each backend in use (TF's default graph, JAX's compilation caches, torch's caches)."""
    done = []
    saved = _keras_settings()
    for name in ("keras", "tf_keras"):
        backend = getattr(sys.modules.get(name), "backend", None)
        clear = getattr(backend, "clear_session", None)
        if clear is None:
            continue
        try:
            clear(free_memory=False)
        except TypeError:  # tf-keras has no free_memory argument
            clear()
        done.append(name)
    _restore_keras_settings(saved)
    from kerasmagic.backends import reset_active  # TF's default graph, JAX's jit caches, torch's

    done.extend(reset_active())
    return done
