"""glibc's heap: the mmap-threshold pin keeps big freed blocks off the heap (real glibc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kerasmagic import cleanup as heap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

# After a 24 MiB block is freed, glibc's dynamic threshold rises to 24 MiB and the next 8 MiB
# block comes from the heap; pinned at 4 MiB it is mmapped (mallinfo2's hblkhd counts it).
PROBE = """
import ctypes, json, sys
sys.path.insert(0, {root!r})
from kerasmagic import cleanup as heap
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
said = heap.pin_mmap_threshold({mb})
big = bytearray(24 << 20); del big          # a freed mmapped block: the dynamic threshold rises
before = libc.mallinfo2().hblkhd
block = bytearray(8 << 20)
print(json.dumps([said, (libc.mallinfo2().hblkhd - before) >> 20, heap._pinned_mb]))
"""


def probe(mb: int, **env: str) -> list[object]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    own = ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")  # the user's own malloc settings
    clean = {k: v for k, v in os.environ.items() if k not in own}
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(root=root, mb=mb)],
        env={**clean, **env}, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_pinned_threshold_keeps_big_blocks_off_the_heap() -> None:
    said, mmapped_mb, pinned = probe(4)
    assert mmapped_mb >= 8 and pinned == 4 and "pinned at 4 MiB" in str(said)


def test_without_a_pin_glibc_puts_the_block_on_the_heap() -> None:
    said, mmapped_mb, pinned = probe(0)  # the behaviour the pin is for: this fails if it changes
    assert mmapped_mb == 0 and pinned is None and "left dynamic" in str(said)


def test_the_users_own_malloc_settings_win() -> None:
    said, mmapped_mb, pinned = probe(4, MALLOC_MMAP_THRESHOLD_=str(64 << 20))
    assert pinned is None and "environment" in str(said) and mmapped_mb == 0


def test_load_pins_and_the_config_can_turn_it_off() -> None:
    code = (
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython()\n"
        "ip.config.KerasMagics.mmap_threshold_mb = {mb}\n"
        "ip.run_line_magic('load_ext', 'kerasmagic')\n"
        "from kerasmagic import cleanup as heap\n"
        "print(heap._pinned_mb)\n"
    )
    for mb, expected in ((4, "4"), (0, "None"), (16, "16")):
        out = subprocess.run(
            [sys.executable, "-c", code.format(mb=mb)], capture_output=True, text=True,
            timeout=120, check=True,
        )  # fmt: skip
        assert out.stdout.strip().splitlines()[-1] == expected, (mb, out.stdout, out.stderr)


def test_glibc_tunables_for_other_things_do_not_stop_the_pin() -> None:
    said, mmapped_mb, pinned = probe(4, GLIBC_TUNABLES="glibc.rtld.optional_static_tls=1024")
    assert pinned == 4 and mmapped_mb >= 8
    said, _, pinned = probe(4, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")
    assert pinned is None and "environment" in str(said)


@pytest.mark.parametrize("value", [-1, 33, 4096, 2**31])
def test_out_of_range_thresholds_are_refused_not_truncated(value: int) -> None:
    from traitlets import TraitError

    from kerasmagic.magics import KerasMagics

    with pytest.raises(ValueError, match="0 to 32 MiB"):
        heap.pin_mmap_threshold(value)
    with pytest.raises(TraitError, match="0 to 32"):
        KerasMagics(shell=None, mmap_threshold_mb=value)
