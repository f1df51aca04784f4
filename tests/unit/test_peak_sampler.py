"""The benchmarks' resident-memory sampler: peaks can leave out work only some contenders do."""

from __future__ import annotations

import numpy as np
import psutil

from benchmarks.processes import PeakRssSampler

BALLAST_BYTES = 64 << 20


def test_samples_taken_while_peaks_are_paused_leave_the_peaks_alone() -> None:
    sampler = PeakRssSampler(lambda: [psutil.Process()])
    sampler.sample()
    before = sampler.peak_total_bytes
    with sampler.peaks_paused():
        ballast = np.ones(BALLAST_BYTES, dtype=np.uint8)  # every page touched
        during = sampler.sample()
    assert during >= before + BALLAST_BYTES // 2
    assert sampler.peak_total_bytes == before
    sampler.sample()
    assert sampler.peak_total_bytes >= before + BALLAST_BYTES // 2
    del ballast


def test_cpu_time_is_followed_while_peaks_are_paused() -> None:
    sampler = PeakRssSampler(lambda: [psutil.Process()])
    snapshot = sampler.cpu_snapshot()
    with sampler.peaks_paused():
        sum(i * i for i in range(2_000_000))
        spent = sampler.cpu_since(snapshot)
    assert spent > 0
