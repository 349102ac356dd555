"""Training seconds a process took over from checkpoints: what each resumed training had spent up to
its checkpoint in earlier, interrupted processes. A job store adds them to a job's seconds, so that a
job resumed after a kill (a session's end) records what its work cost, not only its tail. Kept apart
from the training loop so that the job store reads it without importing torch."""

from __future__ import annotations

_seconds = 0.0


def credit(seconds: float) -> None:
    """Count ``seconds`` of training a checkpoint carried into this process."""
    global _seconds
    _seconds += seconds


def resumed_seconds() -> float:
    """The training seconds this process has taken over from checkpoints so far (a running sum)."""
    return _seconds
