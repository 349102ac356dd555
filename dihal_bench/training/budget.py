"""The matched training budget every method trains under (docs/method.md#budget).

A Budget fixes the optimisation protocol: S optimizer steps of B sequences of T tokens,
AdamW with linear warm-up then cosine decay, gradient clipping, a seed, and an optional
trainable-parameter allowance P that each method must meet within a tolerance. "Matched"
means every method runs exactly this protocol on the same training sequences.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from dihal_bench.base.values import as_float, as_int
from dihal_bench.errors import DihalError


@dataclass(frozen=True)
class Budget:
    """One training protocol, shared by the bridge and every baseline.

    ``epochs`` is the number of passes allowed over the training sequences: 1 is the
    paper's protocol (no sequence seen twice); more lets a small corpus feed a long run.
    """

    steps: int = 300
    batch_size: int = 16  # sequences per optimizer step
    seq_len: int = 64  # tokens per sequence
    lr: float = 3e-4
    warmup_frac: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    epochs: int = 1
    param_allowance: int | None = None
    allowance_tolerance: float = 0.10
    seed: int = 0
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "epochs", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise DihalError(f"budget.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("weight_decay", "grad_clip", "allowance_tolerance", "seed"):
            if getattr(self, name) < 0:
                raise DihalError(f"budget.{name} must not be negative, got {getattr(self, name)}")
        if not 0.0 <= self.warmup_frac < 1.0:
            raise DihalError(f"budget.warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if self.lr <= 0:
            raise DihalError(f"budget.lr must be positive, got {self.lr}")
        if self.param_allowance is not None and self.param_allowance < 1:
            raise DihalError(f"budget.param_allowance must be positive, got {self.param_allowance}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def sequences_needed(self) -> int:
        """Training sequences drawn over the whole run (counting repeats across epochs)."""
        return self.steps * self.batch_size

    @property
    def distinct_sequences(self) -> int:
        """How many different training sequences the run draws (each repeated ``epochs`` times)."""
        return -(-self.sequences_needed // self.epochs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, section: str = "budget", source: str = "") -> Budget:
        """A Budget from a suite table: every value checked against its field's type (a whole
        float such as ``1e5`` is an int; ``"none"`` clears an optional field), unknown keys refused."""
        types = typing.get_type_hints(cls)
        unknown = set(values) - set(types)
        if unknown:
            known = ", ".join(f.name for f in dataclasses.fields(cls))
            prefix = f"{source}: " if source else ""
            raise DihalError(f"{prefix}unknown budget key(s) {', '.join(sorted(unknown))} in {section}; known: {known}")
        return cls(**{key: _typed(value, types[key], f"{section}.{key}", source) for key, value in values.items()})

    def replace(self, **changes) -> Budget:
        return dataclasses.replace(self, **changes)

    def check_fits(self, n_sequences: int) -> None:
        """Raise unless ``n_sequences`` training sequences cover the run within ``epochs`` passes."""
        available = n_sequences * self.epochs
        if self.sequences_needed > available:
            raise DihalError(
                f"budget needs {self.sequences_needed:,} training sequences "
                f"({self.sequences_needed * self.seq_len:,} tokens = {self.steps} steps x "
                f"{self.batch_size} sequences x {self.seq_len} tokens) but the training split has "
                f"{n_sequences:,} sequences ({n_sequences * self.seq_len:,} tokens) x epochs={self.epochs}; "
                f"lower steps or batch_size, add text, or raise budget.epochs to allow repeated passes"
            )

    def check_allowance(self, counts: dict[str, int], name: str = "method") -> float | None:
        """Relative deviation of the total trainable parameters from ``param_allowance``.

        ``counts`` maps each trained component to its parameter count (every trained part
        counts, docs/method.md#budget). Returns None when the budget sets no allowance; raises when
        the deviation is outside ``allowance_tolerance``.
        """
        if self.param_allowance is None:
            return None
        total = sum(counts.values())
        deviation = (total - self.param_allowance) / self.param_allowance
        if abs(deviation) > self.allowance_tolerance:
            parts = " + ".join(f"{part} {n:,}" for part, n in counts.items())
            raise DihalError(
                f"{name} has {total:,} trainable parameters ({parts}), {abs(deviation):.1%} "
                f"{'over' if deviation > 0 else 'under'} the allowance {self.param_allowance:,} "
                f"(±{self.allowance_tolerance:.0%})"
            )
        return deviation


def _typed(value, kind, key: str, source: str):
    """``value`` as the field type ``kind`` (int, float, or ``int | None``)."""
    options = typing.get_args(kind) or (kind,)
    if type(None) in options and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
        return None
    base = next(option for option in options if option is not type(None))
    return as_int(value, key, source) if base is int else as_float(value, key, source)
