"""Timing a call on any device: the median after warm-up, device time on CUDA (the synthetic benches')."""

from __future__ import annotations

import time

import torch


def time_call(fn, device: torch.device, repeats: int, between=None, warmups: int = 2) -> float:
    """Median seconds of fn() over `repeats` calls after `warmups` untimed ones (device time on CUDA)."""
    samples = []
    for i in range(repeats + warmups):
        if between is not None:
            between()
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1000
        else:
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
        if i >= warmups:
            samples.append(seconds)
    samples.sort()
    return samples[len(samples) // 2]
