"""Notebook cells that more than one test module runs."""

from __future__ import annotations

# A Ctrl-C that lands inside a gc callback, during the collection a cleanup (or the cell) runs.
INTERRUPT_IN_GC_CALLBACK = """
import gc, os, signal
def _interrupt_once(phase, info, fired=[]):
    if phase == "start" and not fired:
        fired.append(1)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # Python runs the SIGINT handler here, inside the callback
            pass
gc.callbacks.append(_interrupt_once)
try:
    gc.collect()
    reached = True
finally:
    gc.callbacks.remove(_interrupt_once)
"""

# A custom training step from an earlier cell, and a fresh model and optimizer per call.
TRAIN_STEP = """
@tf.function
def train_step(model, opt, x, y):
    with tf.GradientTape() as tape:
        logits = model(x)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

def fresh_pair(units=8):
    m = keras.Sequential([keras.Input((20,)), keras.layers.Dense(units, activation="relu"),
                          keras.layers.Dense(2)])
    o = keras.optimizers.Adam()
    o.build(m.trainable_variables)
    return m, o
"""
