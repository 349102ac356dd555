"""Stopwatch helpers for timing work on a device: a CUDA device's queued work is finished before
the clock is read, and a noisy timing is taken at its fastest (the machine's noise only ever adds
time)."""

from __future__ import annotations

import time

#: tokens of a warm-up decode: a few, which pay for lazy setup before a decode is timed
WARM_UP_TOKENS = 4


def seconds(work, device=None) -> float:
    """Seconds one call of ``work`` takes, with what it queued on a CUDA ``device`` finished."""
    import torch

    def synchronize():
        if str(device).startswith("cuda"):
            torch.cuda.synchronize(device)

    synchronize()
    started = time.perf_counter()
    work()
    synchronize()
    return time.perf_counter() - started


def fastest(work, repeats: int, device=None) -> float:
    """The fewest seconds of ``repeats`` calls of ``work``: the machine's noise only ever adds time."""
    return min(seconds(work, device) for _ in range(repeats))


def timed_rate(work, tokens: int, device, warm_up=None, repeats: int = 1) -> float:
    """``tokens`` over the seconds a call of ``work`` takes (the fastest of ``repeats``), after one
    (warm-up) call."""
    (warm_up or work)()
    return tokens / max(fastest(work, repeats, device), 1e-9)
