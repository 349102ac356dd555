"""The baseline contract: a text generator trained under a Budget (docs/method.md#baselines).

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
from safetensors.torch import save_file
from torch import Tensor, nn

from dihal_bench.api.backbone import Backbone
from dihal_bench.api.flops import FlopAccount, MethodWork
from dihal_bench.api.likelihood import HeldOutNLL
from dihal_bench.base.files import (
    atomic_path,
    file_sha256,
    read_safetensors,
    write_json_atomic,
)
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import TrainResult, train

WEIGHTS_FILE = "weights.safetensors"
CONFIG_FILE = "baseline.json"


class Baseline(ABC):
    """Subclasses set ``name`` and ``paper``, build their trainable modules in ``__init__``
    (sized to ``budget.param_allowance`` when it is set) and implement the abstract methods. One
    whose architecture depends on the training data (the diffusion baselines' token tables)
    builds its modules in ``fit``, saves what it took from the data in ``config`` and rebuilds
    them from it in ``restore``.

    ``in_budget = False`` marks a reference that trains nothing (the intact backbone):
    tables show it, flagged as outside the budget.
    """

    name: str = ""
    paper: str = ""
    in_budget: bool = True
    #: True for the method that is the intact backbone itself: latency ratios are taken to it
    #: (and lm-eval scores it as the plain backbone)
    intact_backbone: bool = False
    #: True for a method whose every training step runs the whole backbone forward and backward
    #: (the LoRA rivals): the dry run's cost estimate counts those passes
    trains_through_backbone: bool = False
    #: the option that sets the number of diffusion sampling steps, which a suite fills from
    #: ``sampling.diffusion_steps`` (None: the method has no such steps)
    steps_option: str | None = None
    #: the options, named like the suite's ``sampling.temperature`` and ``sampling.top_p``, that set
    #: how the method's autoregressive decoder draws each token, which a suite fills from those
    #: keys (empty: the method draws no tokens from a next-token distribution)
    token_sampling_options: tuple[str, ...] = ()
    #: the precision of the probabilities the method's categorical draws read ("float32", "float64"), or
    #: "argmax" where it draws none (docs/method.md#sampling); None: not stated. Recorded per row.
    draw_precision: str | None = None
    #: the sampling options (of ``steps_option`` and ``token_sampling_options``) that ``test_nll``
    #: reads, so that its job is redone when they change (a bound of the chain the row samples with)
    likelihood_options: tuple[str, ...] = ()

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

    @classmethod
    def flop_account(cls, work: MethodWork) -> FlopAccount | None:
        """Optional: the method's training FLOPs in all and inference FLOPs per generated token,
        from ``work`` (the backbone's shape, the recorded parameters by role, the budget, the
        sampling options; docs/method.md#counting-compute). None, the default, reads "unknown":
        a plugin that does not count is never given a number."""
        return None

    def config(self) -> dict:
        """JSON-able description that rebuilds the same architecture: ``cls(backbone, budget, seed, **options)``,
        then :meth:`restore` of this description where the architecture also depends on the training data.
        ``backbone`` names the backbone it was trained with (what ``baseline sample`` loads by default)."""
        return {"name": self.name, "seed": self.seed, "options": self.options, "budget": self.budget.to_dict(),
                "backbone": self.backbone.name}

    def restore(self, saved: dict, directory: Path) -> None:
        """Rebuild, from a saved :meth:`config` (read from ``directory``), what the architecture took
        from the training data, before the weights are read into it. Nothing, by default."""

    def check_saved(self, saved: dict, directory: Path) -> None:
        """A DihalError unless the ``saved`` config is this method's, trained with the same options.
        The options that only shape sampling (``steps_option``, ``token_sampling_options``) may
        differ: one trained model samples under any of them."""
        sampling_only = {self.steps_option, *self.token_sampling_options}

        def training(options) -> dict | None:
            return {k: v for k, v in options.items() if k not in sampling_only} if isinstance(options, dict) else None

        if saved.get("name") != self.name or training(saved.get("options")) != training(self.options):
            raise DihalError(f"{directory} holds {saved.get('name')!r} with options {saved.get('options')}, "
                             f"not {self.name!r} with {self.options}")

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

    # -- likelihood ---------------------------------------------------------------------------
    def test_nll(self, windows: Tensor, seed: int, batch_size: int = 16) -> HeldOutNLL | None:
        """Optional: −log p of the held-out ``windows`` (n, T) of backbone ids, every token scored
        (docs/method.md#test-nll): exact where the method's likelihood is tractable, its own upper
        bound (``bound=True``) where it has an ELBO, any randomness drawn from ``seed``. None, the
        default, reads "this method has no likelihood". The harness passes only windows whose every
        token occurs in the training sequences, so a compact vocabulary covers them."""
        return None

    # -- persistence --------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """``weights.safetensors`` (trained parameters and buffers) and ``baseline.json`` (the
        config and the weights' sha256, which `load` verifies), each written atomically, the
        JSON last."""
        directory = Path(directory)
        module = self.module()
        tensors = {k: v.detach().contiguous() for k, v in module.state_dict(keep_vars=True).items()
                   if not isinstance(v, nn.Parameter) or v.requires_grad}
        with atomic_path(directory / WEIGHTS_FILE) as temporary:
            save_file(_dedupe(tensors), str(temporary))
            digest = file_sha256(temporary)
        write_json_atomic(directory / CONFIG_FILE, {**self.config(), "weights_sha256": digest})

    def load(self, directory: Path) -> None:
        directory = Path(directory)
        if not (directory / WEIGHTS_FILE).exists():
            raise DihalError(f"{self.name}: no trained checkpoint in {directory}; train it first "
                             f"(dihal-bench baseline train {self.name})")
        saved = read_config(directory)
        self.check_saved(saved, directory)
        self.restore(saved, directory)
        # weights saved before baseline.json held a sha256 are still read, unverified
        weights = read_safetensors(directory / WEIGHTS_FILE, saved.get("weights_sha256"),
                                   recorded_in=directory / CONFIG_FILE)
        missing, unexpected = self.module().load_state_dict(weights, strict=False)
        trained = {k for k, v in self.module().state_dict(keep_vars=True).items()
                   if not isinstance(v, nn.Parameter) or v.requires_grad}
        if unexpected or trained & set(missing):
            raise DihalError(f"{directory}: checkpoint does not match {self.name} "
                             f"(missing {sorted(trained & set(missing))[:3]}, unexpected {sorted(unexpected)[:3]})")


def read_config(directory: Path) -> dict:
    """A saved baseline's ``baseline.json``; DihalError naming the file when it is missing,
    not JSON or not an object."""
    path = Path(directory) / CONFIG_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DihalError(f"{directory} holds no saved baseline: {CONFIG_FILE} is missing") from None
    except (OSError, ValueError) as exc:
        raise DihalError(f"{path} is not readable JSON ({exc}): the file is damaged; train it again") from None
    if not isinstance(saved, dict):
        raise DihalError(f"{path} is not a baseline description (a JSON {type(saved).__name__})")
    return saved


def _dedupe(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """safetensors refuses tensors that share memory (tied weights): keep a clone of repeats."""
    seen: set[int] = set()
    out = {}
    for key, value in tensors.items():
        ptr = value.data_ptr()
        out[key] = value.clone() if ptr in seen else value
        seen.add(ptr)
    return out

