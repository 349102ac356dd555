"""The baseline contract: a text generator trained under a Budget (DESIGN.md §4.3).

A baseline plugin registers a subclass of :class:`Baseline` through ``register_baselines``.
The harness builds it from (backbone, budget, seed, options), trains it on the packed
training sequences through the shared training loop, checks its trainable parameters
against the budget's allowance, and samples ``n`` texts of ``T`` tokens from it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from dihal_bench.backbone import Backbone
from dihal_bench.budget import Budget
from dihal_bench.errors import DihalError
from dihal_bench.training import TrainResult, train

WEIGHTS_FILE = "weights.safetensors"
CONFIG_FILE = "baseline.json"


class Baseline(ABC):
    """Subclasses set ``name`` and ``paper``, build their trainable modules in ``__init__``
    (sized to ``budget.param_allowance`` when it is set) and implement the abstract methods.

    ``in_budget = False`` marks a reference that trains nothing (the intact backbone):
    tables show it, flagged as outside the budget.
    """

    name: str = ""
    paper: str = ""
    in_budget: bool = True
    #: the option that sets the number of diffusion sampling steps, which a suite fills from
    #: ``sampling.diffusion_steps`` (None: the method has no such steps)
    steps_option: str | None = None

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        self.backbone = backbone
        self.budget = budget
        self.seed = seed
        self.options = options

    # -- what the harness reads ---------------------------------------------------------------
    @abstractmethod
    def components(self) -> dict[str, nn.Module]:
        """The trained modules by role (denoiser, embeddings, decoder, compressor, readout).
        Parameters shared between components are counted in the first one only."""

    def parameter_counts(self) -> dict[str, int]:
        seen: set[int] = set()
        counts = {}
        for role, module in self.components().items():
            params = [p for p in module.parameters() if p.requires_grad and id(p) not in seen]
            seen.update(id(p) for p in params)
            counts[role] = sum(p.numel() for p in params)
        return counts

    def sampling_options(self) -> dict:
        """The options that shape sampling (steps, temperature, ...), for the run record."""
        return {}

    def config(self) -> dict:
        """JSON-able description that rebuilds the same architecture: ``cls(backbone, budget, seed, **options)``."""
        return {"name": self.name, "seed": self.seed, "options": self.options, "budget": self.budget.to_dict()}

    # -- training -----------------------------------------------------------------------------
    def module(self) -> nn.Module:
        """All trained components as one module (what the optimizer and checkpoints see)."""
        return nn.ModuleDict(self.components())

    @abstractmethod
    def training_data(self, sequences: Tensor) -> dict[str, Tensor]:
        """Per-sequence training tensors from packed token ids (n, T); may precompute
        frozen-backbone features here, once, instead of in every step."""

    @abstractmethod
    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        """Scalar loss on one batch; all randomness drawn from ``generator``."""

    def fit(self, sequences: Tensor, checkpoint_dir: Path | None = None, progress: bool = True) -> TrainResult:
        self.budget.check_allowance(self.parameter_counts(), name=self.name)
        data = self.training_data(sequences)
        return train(self.module(), lambda _m, batch, g: self.loss(batch, g), data, self.budget,
                     checkpoint_dir=checkpoint_dir, progress=progress, desc=self.name)

    # -- sampling -----------------------------------------------------------------------------
    @abstractmethod
    def sample(self, n: int, seq_len: int, seed: int, batch_size: int = 16, progress: bool = False) -> Tensor:
        """Token ids (n, seq_len) in the backbone's vocabulary; same seed, same tokens."""

    # -- persistence --------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        module = self.module()
        tensors = {k: v.detach().contiguous() for k, v in module.state_dict(keep_vars=True).items()
                   if not isinstance(v, nn.Parameter) or v.requires_grad}
        save_file(_dedupe(tensors), str(directory / WEIGHTS_FILE))
        (directory / CONFIG_FILE).write_text(json.dumps(self.config(), indent=2))

    def load(self, directory: Path) -> None:
        directory = Path(directory)
        if not (directory / WEIGHTS_FILE).exists():
            raise DihalError(f"{self.name}: no trained checkpoint in {directory}; train it first "
                             f"(dihal-bench baseline train {self.name})")
        saved = json.loads((directory / CONFIG_FILE).read_text())
        if saved.get("name") != self.name or saved.get("options") != self.options:
            raise DihalError(f"{directory} holds {saved.get('name')!r} with options {saved.get('options')}, "
                             f"not {self.name!r} with {self.options}")
        missing, unexpected = self.module().load_state_dict(load_file(str(directory / WEIGHTS_FILE)), strict=False)
        trained = {k for k, v in self.module().state_dict(keep_vars=True).items()
                   if not isinstance(v, nn.Parameter) or v.requires_grad}
        if unexpected or trained & set(missing):
            raise DihalError(f"{directory}: checkpoint does not match {self.name} "
                             f"(missing {sorted(trained & set(missing))[:3]}, unexpected {sorted(unexpected)[:3]})")


def _dedupe(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """safetensors refuses tensors that share memory (tied weights): keep a clone of repeats."""
    seen: set[int] = set()
    out = {}
    for key, value in tensors.items():
        ptr = value.data_ptr()
        out[key] = value.clone() if ptr in seen else value
        seen.add(ptr)
    return out

