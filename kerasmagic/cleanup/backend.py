"""Reset the Keras backend's global state.

``clear_session()`` resets names, graphs and kernel caches, and with them user settings kept in
the same global state (dtype policy, random seed): those are saved and put back. Then each
backend in use empties its own caches (``kerasmagic.backends``).
"""

from __future__ import annotations

import sys
from typing import Any

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
    state = sys.modules.get("keras.src.backend.common.global_state")
    getter = getattr(state, "get_global_attribute", None)
    if getter is None:
        return {}
    values = {name: getter(name) for name in KERAS_SETTINGS}
    return {name: value for name, value in values.items() if value is not None}


def _restore_keras_settings(saved: dict[str, Any]) -> None:
    state = sys.modules.get("keras.src.backend.common.global_state")
    setter = getattr(state, "set_global_attribute", None)
    for name, value in saved.items():
        if setter is not None:
            setter(name, value)


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
