"""Ctrl-C, delivered as the user expects: held while kerasmagic works (``held``), raised again
where a library swallowed it (``swallowed``) or Python lost it in a finalizer (``lost``),
guarded in the kernel's own code around a cell (``kernelguard``), and the modes an interrupt
left switched put back: PyTorch's gradients, TensorFlow's eager execution (``modes``)."""
