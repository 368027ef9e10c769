"""The RAM reading: its peak is never below its RSS."""

from __future__ import annotations

import threading

from kerasmagic.probes import ram_info, read_ram

MB = 2**20


def test_a_peak_read_below_the_rss_is_the_rss() -> None:
    """The panel showed peak 800.6 MB under RSS 800.8 MB: ru_maxrss lags the RSS counters."""
    info = ram_info(int(800.8 * MB), int(800.6 * MB), 16_000 * MB, 8_000 * MB)
    assert info.peak_rss_bytes == info.rss_bytes == int(800.8 * MB)
    higher = ram_info(700 * MB, 900 * MB, 16_000 * MB, 8_000 * MB)
    assert (higher.rss_bytes, higher.peak_rss_bytes) == (700 * MB, 900 * MB)
    assert ram_info(700 * MB, None, 16_000 * MB, 8_000 * MB).peak_rss_bytes is None  # unknown


def test_every_reading_has_its_peak_at_or_above_its_rss() -> None:
    """Read while another thread grows and frees memory page by page."""
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            block = bytearray(8 * MB)
            for i in range(0, len(block), 4096):
                block[i] = 1
            del block

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        readings = [read_ram() for _ in range(2000)]
    finally:
        stop.set()
        worker.join()
    low = [r for r in readings if r.peak_rss_bytes is not None and r.peak_rss_bytes < r.rss_bytes]
    assert low == []
