"""The run every seed of a suite shares: config, job store, models and data (docs/method.md#suites)."""

from __future__ import annotations

import copy
import dataclasses
from functools import cached_property
from pathlib import Path

import torch
from safetensors.torch import load_file

from dihal_bench.api.backbone import Backbone, BackboneShape
from dihal_bench.api.bridge import HiddenStateBridge
from dihal_bench.api.metrics import Evaluator
from dihal_bench.api.references import held_out_windows
from dihal_bench.base.mapped import map_safetensors
from dihal_bench.config.settings import SuiteConfig
from dihal_bench.config.suite import resolve_device, resolve_dtype
from dihal_bench.hybrid.training import (
    BridgeSpec,
    SplitTensors,
    bridge_windows,
    packed_split,
    train_bridge,
    train_bridge_streamed,
    training_subset,
    validation_subset,
    with_states,
)
from dihal_bench.registry.resolve import load_backbone, load_corpus, load_evaluator
from dihal_bench.study.jobs import JobStore
from dihal_bench.study.preflight import check_model_inputs
from dihal_bench.training.budget import Budget


class Run:
    """What every seed of a suite run shares: the resolved config, the job store, and lazily loaded
    models and data. Nothing here belongs to one seed: a seed's state is the driver's
    (``dihal_bench.study.runner.SeedStudy``), and what a unit needs of it comes as an argument.

    ``device`` loads the models elsewhere than the suite's device (and without its device_map):
    a Ray driver loads them on the CPU, a Ray actor on the one GPU Ray gave it."""

    def __init__(self, suite: str, config: SuiteConfig, out_root: Path, progress: bool = True,
                 device: str | None = None, inexact_remakes: bool = False):
        self.suite, self.config, self.progress, self.device = suite, config, progress, device
        self.out_root = Path(out_root)
        self.store = JobStore(self.out_root / suite / "jobs", inexact_remakes=inexact_remakes)
        self._valid_states: dict[int, SplitTensors] = {}

    def with_sampling(self, **changes) -> Run:
        """This run with other ``[sampling]`` settings (a frontier point, docs/method.md#frontiers):
        the same job store and the same models and data, loaded once for both."""
        variant = copy.copy(self)
        variant.config = dataclasses.replace(self.config, sampling=dataclasses.replace(self.config.sampling, **changes))
        return variant

    # -- lazily loaded, shared by the jobs that need them ---------------------------------------
    @cached_property
    def backbone(self) -> Backbone:
        return load_backbone(self.config.backbone, **self._load_options())

    @cached_property
    def evaluator(self) -> Evaluator:
        if self.config.evaluator == self.config.backbone:
            return self.backbone
        return load_evaluator(self.config.evaluator, **self._load_options())

    @cached_property
    def corpus(self):
        return load_corpus(self.config.corpus)

    def _load_options(self) -> dict:
        # "auto" resolved here too, so that a Run built from any suite config (not only run_suite's
        # resolved one) loads where the run would
        device = self.device or resolve_device(self.config.device)
        options = {"device": device, "dtype": resolve_dtype(self.config.dtype, device)}
        if self.config.device_map and self.device is None:
            options["device_map"] = self.config.device_map
        return options

    def identity(self) -> dict:
        """What every job depends on: the data and the backbone."""
        return {"backbone": self.config.backbone, "corpus": self.config.corpus}

    # -- data -------------------------------------------------------------------------------------
    def check_inputs(self) -> None:
        """The pre-flight checks of what the model and its data can take (explicit sweep layers,
        locate's tokens and dropped channels, every budget against the training split), again
        with the backbone loaded: for a backbone plugin whose ``describe`` or ``tokenizer`` hook
        is missing or could not say, this is where they are first known."""
        self.corpus  # built first: a missing corpus path is refused before the models load
        check_model_inputs(self.config, BackboneShape.of(self.backbone), self.backbone.tokenizer, self.corpus)

    def train_sequences(self, budget: Budget, seed: int) -> torch.Tensor:
        """The training sequences a budget draws: a prefix of the seed's permutation of the
        training split, the same prefix the bridge-targets job stores."""
        packed = packed_split(self.backbone, self.corpus, "train", budget.seq_len)
        return training_subset(packed, [budget], seed)[:budget.distinct_sequences]

    def train_states(self, budget: Budget, layer: int, targets: dict) -> SplitTensors:
        """The bridge windows of the training sequences a budget draws, with the bridge's condition
        (h_0) and target (h_layer), from ``targets``, the seed's bridge-targets job results by
        sequence length: its files memory-mapped, so that training, which reads a batch of rows at
        a time, does not hold a split's states in memory."""
        stored = targets[budget.seq_len]
        count = budget.distinct_sequences
        sequences = load_file(self.store.resolve(stored["sequences"]))["sequences"][:count]
        states = {at: map_safetensors(self.store.resolve(stored["layers"][str(at)]))["states"][:count]
                  for at in (0, layer)}
        return SplitTensors(sequences, states)

    def train_bridge(self, spec: BridgeSpec, layer: int, checkpoint: Path, targets: dict) -> tuple[HiddenStateBridge, dict]:
        """Train ``spec``'s bridge for ``layer`` on the seed's training windows: on the states the
        bridge-targets job stored, or, with ``bridge.targets = "streamed"``, on states the frozen
        layers 1..ℓ compute for each batch (nothing stored; memory bounded by the batch)."""
        if self.config.bridge.streams_targets:
            windows = bridge_windows(self.backbone, self.train_sequences(spec.budget, spec.budget.seed))
            return train_bridge_streamed(self.backbone, spec, layer, windows, checkpoint, self.progress)
        return train_bridge(self.backbone, spec, layer, self.train_states(spec.budget, layer, targets), checkpoint,
                            self.progress)

    def valid_states(self, seq_len: int, layer: int, data_layers: list[int]) -> SplitTensors:
        """The validation windows bridgeability reads (all of them, or the seeded
        ``sweep.bridgeability_windows``; the LM measures take a seeded subset of these) with
        their states: at every bridge layer of the seed (``data_layers``) from one pass that all
        the seed's jobs share, or, when targets are streamed, at ``layer`` alone, so that memory
        holds one layer's states and the pass stops at ℓ."""
        layers = [layer] if self.config.bridge.streams_targets else data_layers
        cache = self._valid_states
        if seq_len not in cache or not set(layers) <= set(cache[seq_len].states):
            sequences = validation_subset(packed_split(self.backbone, self.corpus, "validation", seq_len),
                                          self.config.sweep.bridgeability_windows)
            cache[seq_len] = with_states(self.backbone, sequences, layers, self.progress)
        return cache[seq_len]

    def held_out_texts(self, split: str, n: int, seq_len: int, seed: int) -> tuple[list[str], torch.Tensor]:
        """Up to ``n`` windows of ``seq_len`` backbone tokens from a held-out split, a seeded random
        subset (references.held_out_windows), decoded: (texts, token ids)."""
        windows = packed_split(self.backbone, self.corpus, split, seq_len)
        picked = held_out_windows(windows, min(n, len(windows)), seed, what=split)
        return self.backbone.tokenizer.batch_decode(picked, skip_special_tokens=True), picked

    def reference_texts(self, n: int, seq_len: int, seed: int) -> list[str]:
        """MAUVE's references (its P side): up to ``n`` test-split windows, a seeded subset.
        The human reference row reads the validation split, so the two never share a window."""
        return self.held_out_texts("test", n, seq_len, seed)[0]
