"""Pure, typed memory probes: each returns a frozen dataclass and never raises for "absent".

What is measured whatever the backend: this process's RAM, NVML's GPUs, Keras's state (and
the namespace's largest data). Backend internals (TensorFlow's allocator and graphs, JAX,
PyTorch) are in ``kerasmagic.backends``. No probe imports IPython, TensorFlow or NVML at
import time.
"""

from kerasmagic.probes.keras_state import KerasInfo, read_keras
from kerasmagic.probes.nvml import GpuDevice, GpuInfo, read_gpus
from kerasmagic.probes.ram import RamInfo, read_ram

__all__ = [
    "GpuDevice",
    "GpuInfo",
    "KerasInfo",
    "RamInfo",
    "read_gpus",
    "read_keras",
    "read_ram",
]
