"""The memory a suite's largest steps need, priced before any model loads, and refused when the
machine has less (docs/faults.md).

The price is an estimate of the dominant arrays, not of every allocation: a request off by orders
of magnitude (``budget.batch_size=100000``) is refused with its number instead of being killed by
the kernel an hour in; one within a factor of two of the machine is let through. Counted, each in
the suite's dtype or float32 where the code computes in float32:

- the models' weights (`dihal_bench.study.estimate.worker_memory`);
- one training step of each budget: its logits, their log-softmax and their gradient,
  3 x batch x seq_len x vocabulary x 4 bytes, and the batch's hidden states at every layer;
- one sampling step: the logits of a batch and its key/value cache over every layer;
- the metrics' whole-sample arrays: every sample's evaluator feature (width floats) and token
  ids, and with MAUVE every reference's feature at each of its token positions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dihal_bench.config.settings import SuiteConfig
from dihal_bench.errors import DihalError

FLOAT32 = 4
INT64 = 8


@dataclass(frozen=True)
class Need:
    """One priced step: its bytes, the setting that drives it and how the number is made."""

    bytes: int
    setting: str
    formula: str


def memory_needs(config: SuiteConfig, shape, vocab: int | None) -> list[Need]:
    """The priced steps of ``config`` for a backbone of ``shape`` (layers, width; None: unknown)
    and a vocabulary of ``vocab`` tokens (None: unknown): what is known is priced."""
    from dihal_bench.study.plan import budget_sections
    from dihal_bench.study.protocol import section_budget

    needs = []
    layers = shape.num_layers if shape is not None else None
    width = shape.width if shape is not None else None
    for section in budget_sections(config, layers):
        budget = section_budget(config, section, seed=0)
        tokens = budget.batch_size * budget.seq_len
        if vocab:
            needs.append(Need(3 * tokens * vocab * FLOAT32, f"{section}.batch_size={budget.batch_size}",
                              f"3 x {budget.batch_size} x {budget.seq_len} tokens x {vocab} vocabulary x 4 bytes "
                              "(logits, log-softmax, gradient)"))
        if width and layers:
            needs.append(Need(tokens * width * (layers + 1) * FLOAT32, f"{section}.batch_size={budget.batch_size}",
                              f"{budget.batch_size} x {budget.seq_len} tokens x {layers + 1} layers x {width} "
                              "width x 4 bytes (hidden states)"))
    sampling, metrics = config.sampling, config.metrics
    if vocab and width and layers:
        batch, length = sampling.batch_size, sampling.seq_len + 1
        needs.append(Need(batch * length * (vocab + 2 * layers * width) * FLOAT32,
                          f"sampling.batch_size={batch}",
                          f"{batch} x {length} tokens x ({vocab} vocabulary + 2 x {layers} layers x {width} width) "
                          "x 4 bytes (logits, key/value cache)"))
    if width:
        n = sampling.samples
        arrays = n * (width * FLOAT32 + (sampling.seq_len + 1) * INT64)
        formula = f"{n} samples x ({width} width x 4 + {sampling.seq_len + 1} tokens x 8) bytes"
        if metrics.mauve:
            positions = min(metrics.max_length, sampling.seq_len + 1)
            arrays += n * positions * width * FLOAT32
            formula += f" + {n} references x {positions} positions x {width} width x 4 bytes (MAUVE)"
        needs.append(Need(arrays, f"sampling.samples={n}", formula))
    return needs


def machine_memory(device: str) -> tuple[int | None, str]:
    """(bytes, what they are) of the memory the suite's device computes in: the GPU's for a CUDA
    device, else the host's physical memory; None when it cannot be read."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            index = torch.device(device).index or 0
            return torch.cuda.get_device_properties(index).total_memory, f"GPU {device}'s memory"
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory"
    except (ValueError, OSError, AttributeError):
        return None, "this machine's memory"


def check_memory(config: SuiteConfig, shape, vocab: int | None, weights: int | None) -> None:
    """DihalError when the weights plus any one priced step (`memory_needs`) exceed the memory
    of the suite's device, naming the setting, the number, how it is made and what the machine has."""
    available, what = machine_memory(config.device)
    if available is None:
        return
    weights = weights or 0
    for need in memory_needs(config, shape, vocab):
        if weights + need.bytes > available:
            raise DihalError(f"{need.setting} needs about {gib(weights + need.bytes)} of memory "
                             f"({need.formula}{f', plus {gib(weights)} of weights' if weights else ''}), more "
                             f"than {what}, {gib(available)}: lower {need.setting.split('=')[0]}")


def gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"
