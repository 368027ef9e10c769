"""Pure, typed memory probes: each returns a frozen dataclass and never raises for "absent".

No probe imports IPython, TensorFlow or NVML at import time.
"""

from kerasmagic.probes.graph import GraphInfo, read_graph
from kerasmagic.probes.keras_state import KerasInfo, read_keras
from kerasmagic.probes.nvml import GpuDevice, GpuInfo, read_gpus
from kerasmagic.probes.ram import RamInfo, read_ram
from kerasmagic.probes.tf_alloc import TfDeviceMemory, TfInfo, read_tf

__all__ = [
    "GpuDevice",
    "GpuInfo",
    "GraphInfo",
    "KerasInfo",
    "RamInfo",
    "TfDeviceMemory",
    "TfInfo",
    "read_gpus",
    "read_graph",
    "read_keras",
    "read_ram",
    "read_tf",
]
