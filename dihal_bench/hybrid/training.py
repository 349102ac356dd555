"""How one bridge is trained and measured (docs/method.md#bridge), shared by the sweep, the
runner's DiHAL methods and the single-stage commands.

A :class:`BridgeSpec` says which registered bridge, with which options, under which budget.
The training data is a seeded subset of the packed training split (:func:`training_subset`),
made into the bridge's windows (:func:`bridge_windows`: the start token, then the text) with
their hidden states at the layers needed (:func:`with_states`), extracted once and shared by
every bridge that trains on it; the baselines train on the same text windows.

**Choice: the start token.** Every autoregressive method starts generating from one token,
``hybrid.start_token_id`` (BOS, else EOS), which packed text windows never hold (they carry
no special tokens). So that the bridge sees in training the position 0 it starts from in
sampling, its windows, training and validation alike, are that token followed by the first
T−1 tokens of a text window: the length stays T (the bridge's learned positions and the
budget's tokens per step are unchanged) and window i holds the same text as the baselines'
window i, less its last token. Position 0 is then always the same token, whose exact state
(the sink) the bridge is given rather than learns (docs/method.md#bridge).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from dihal_bench.api.backbone import Backbone
from dihal_bench.api.bridge import HiddenStateBridge, MaskedMoments, training_loss
from dihal_bench.api.corpus import Corpus, pack, tokenize_documents
from dihal_bench.api.likelihood import with_start
from dihal_bench.api.references import held_out_windows
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.evaluation import (
    bridge_reconstruction,
    hybrid_against_backbone,
    teacher_forced_nll,
)
from dihal_bench.hybrid.model import HybridLM, skip_control, start_token_id
from dihal_bench.locate.hidden_states import extract_layers
from dihal_bench.registry.resolve import build_bridge
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import count_trainable, train

#: what a trained bridge's data and objective are, beyond the spec: job hashes include it, so that
#: bridges trained on text-only windows or without the sink held are not reused
BRIDGE_PROTOCOL = "start-token windows, sink held in training and sampling"


@dataclass
class BridgeSpec:
    """Which bridge plugin, with which options, trained under which budget."""

    name: str = "dihal-bridge"
    options: dict = field(default_factory=dict)
    budget: Budget = field(default_factory=Budget)
    sample_steps: int | None = None  # None: the bridge's own default
    sink_passthrough: bool = True

    def build(self, width: int) -> HiddenStateBridge:
        return build_bridge(self.name, width, **self.options)

    def parameter_count(self, width: int) -> int:
        return count_trainable(self.build(width))

    def identity(self, width: int) -> dict:
        """What a trained bridge depends on, for job hashes. The parameter count stands in for
        the architecture, so that a changed bridge implementation does not reuse stale jobs."""
        return {"bridge": self.name, "options": self.options, "budget": self.budget.to_dict(),
                "sample_steps": self.sample_steps, "sink_passthrough": self.sink_passthrough,
                "bridge_parameters": self.parameter_count(width), "protocol": BRIDGE_PROTOCOL}


@dataclass
class SplitTensors:
    """Packed token sequences of one split and their hidden states at the needed layers."""

    sequences: torch.Tensor
    states: dict[int, torch.Tensor]

    @property
    def mask(self) -> torch.Tensor:
        mask = torch.ones(self.sequences.shape, dtype=torch.bool)
        mask[:, 0] = False  # the attention sink: given to the bridge exactly, never learned
        return mask

    def head(self, count: int) -> SplitTensors:
        return SplitTensors(self.sequences[:count], {layer: s[:count] for layer, s in self.states.items()})


def packed_split(backbone: Backbone, corpus: Corpus, split: str, seq_len: int) -> torch.Tensor:
    return pack(tokenize_documents(corpus.split(split), backbone.tokenizer), seq_len, split_name=split)


def training_subset(sequences: torch.Tensor, budgets: list[Budget], seed: int) -> torch.Tensor:
    """The training sequences the budgets draw from: a seeded random subset large enough for
    the largest of them. Every budget trains on a prefix of it, so methods share their data
    and one hidden-state extraction serves them all."""
    for budget in budgets:
        budget.check_fits(len(sequences))
    count = min(len(sequences), max(b.distinct_sequences for b in budgets))
    order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(seed))
    return sequences[order[:count]]


def bridge_windows(backbone: Backbone, sequences: torch.Tensor) -> torch.Tensor:
    """The bridge's windows (n, T) made from text windows (n, T): the start token the hybrid
    generates from, then each text window's first T−1 tokens (the module's choice above)."""
    if sequences.dim() != 2 or sequences.shape[1] < 2:
        raise DihalError(f"bridge windows need text windows (n, T) with T ≥ 2, got shape {tuple(sequences.shape)}")
    return with_start(sequences[:, :-1], start_token_id(backbone.tokenizer))


#: the seed of the validation subset bridgeability is measured on: one fixed subset, the same
#: windows for every run seed and every layer, so that their measurements compare
EVAL_SUBSET_SEED = 0


def validation_subset(sequences: torch.Tensor, count: int | str) -> torch.Tensor:
    """The validation windows bridgeability and the hybrid's perplexity are measured on: all of
    ``sequences`` for ``"all"``, else ``count`` of them (all, if fewer), a seeded random subset
    rather than the first ones, which would cover only the split's first documents."""
    if count == "all" or count >= len(sequences):
        return sequences
    return held_out_windows(sequences, count, EVAL_SUBSET_SEED, what="validation")


def with_states(backbone: Backbone, sequences: torch.Tensor, layers: list[int], progress: bool = True) -> SplitTensors:
    """The bridge windows of text windows ``sequences`` (:func:`bridge_windows`) with their hidden
    states at ``layers`` and at 0 (the bridge's condition), from forward passes that stop at
    max(layers): a bridge at layer 3 of a 30-layer backbone costs a tenth of a full pass to feed."""
    windows = bridge_windows(backbone, sequences)
    return SplitTensors(windows, extract_layers(backbone, windows, sorted({0, *layers}), progress=progress))


def train_bridge(backbone: Backbone, spec: BridgeSpec, layer: int, train_data: SplitTensors,
                 checkpoint_dir: Path | None = None, progress: bool = True) -> tuple[HiddenStateBridge, dict]:
    """Fit the standardiser and train one bridge for ``layer``; returns it and its training stats."""
    mask = train_data.mask
    cond, target = train_data.states[0], train_data.states[layer]
    torch.manual_seed(spec.budget.seed)  # the same initial weights for every layer of a sweep
    # built on the CPU (the same initial weights on any device), trained where the backbone runs
    bridge = spec.build(backbone.width).to(backbone.device)
    bridge.fit_standardizer(cond, target, mask)
    result = train(bridge, training_loss, {"cond": cond, "target": target, "mask": mask}, spec.budget,
                   checkpoint_dir=checkpoint_dir, progress=progress, desc=f"bridge ℓ={layer}")
    return bridge, _training_stats(bridge, result)


def _training_stats(bridge: HiddenStateBridge, result) -> dict:
    return {
        "parameters": count_trainable(bridge),
        "steps": result.steps_done,
        "tokens_seen": result.tokens_seen,
        "train_seconds": result.seconds,
        "final_loss": sum(result.losses[-10:]) / len(result.losses[-10:]),
    }


#: sequences per forward pass when the streamed path fits the standardiser
STANDARDIZER_CHUNK = 16


class StreamedStates:
    """The hidden states of bridge windows computed a batch at a time, never stored.

    A bridge at layer ℓ needs h_0 and h_ℓ of its training windows. Stored (:func:`with_states`)
    they take n × T × d × 4 bytes per layer, which at 8B-backbone sizes does not fit memory;
    streamed, each training step runs the frozen backbone's layers 1..ℓ on its own batch
    (a cost proportional to ℓ, small for the shallow layers DiHAL picks), so memory is bounded
    by the batch. The states are the same numbers the stored path holds, up to the float
    rounding of a different batch composition.
    """

    def __init__(self, backbone: Backbone, layer: int):
        self.backbone, self.layer = backbone, backbone.check_layer(layer, allow_last=True)

    @torch.no_grad()
    def __call__(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_0, h_ℓ) of bridge windows (n, T), float32, on the backbone's device."""
        states = self.backbone.hidden_states(windows, up_to=self.layer)
        return states[0].float(), states[self.layer].float()

    def fit_standardizer(self, bridge: HiddenStateBridge, windows: torch.Tensor,
                         chunk: int = STANDARDIZER_CHUNK) -> None:
        """The bridge's standardiser from one streamed pass over ``windows``: the same
        statistics :meth:`HiddenStateBridge.fit_standardizer` takes from stored states."""
        cond = MaskedMoments(self.backbone.width, "cond")
        target = MaskedMoments(self.backbone.width, "target")
        for start in range(0, len(windows), chunk):
            rows = windows[start : start + chunk]
            h0, hl = self(rows)
            mask = SplitTensors(rows, {}).mask
            cond.add(h0, mask)
            target.add(hl, mask)
        bridge.set_standardizer(cond.result(), target.result())

    def loss(self, bridge: HiddenStateBridge, batch: dict[str, torch.Tensor], generator: torch.Generator):
        """A ``dihal_bench.training.loop.train`` loss function whose batch holds only ``windows``."""
        windows = batch["windows"]
        cond, target = self(windows)
        device = bridge.target_mean.device
        return bridge.loss(cond.to(device), target.to(device), SplitTensors(windows, {}).mask.to(device), generator)


def train_bridge_streamed(backbone: Backbone, spec: BridgeSpec, layer: int, windows: torch.Tensor,
                          checkpoint_dir: Path | None = None, progress: bool = True) -> tuple[HiddenStateBridge, dict]:
    """:func:`train_bridge` on bridge windows (n, T) whose states are computed per batch
    (:class:`StreamedStates`) rather than read from stored tensors: the same bridge, the same
    seeds and data order, memory bounded by the batch."""
    states = StreamedStates(backbone, layer)
    torch.manual_seed(spec.budget.seed)  # the same initial weights as train_bridge
    bridge = spec.build(backbone.width).to(backbone.device)
    states.fit_standardizer(bridge, windows)
    result = train(bridge, states.loss, {"windows": windows}, spec.budget, checkpoint_dir=checkpoint_dir,
                   progress=progress, desc=f"bridge ℓ={layer} (streamed)")
    return bridge, _training_stats(bridge, result)


def evaluate_layer(backbone: Backbone, bridge: HiddenStateBridge, layer: int, spec: BridgeSpec,
                   valid: SplitTensors, batch_size: int = 16, *, lm_windows: int | str = "all",
                   skip: bool = True) -> dict:
    """Bridgeability (standardised MSE, the same in the ``trace`` metric, R²) on every window of
    ``valid``, and the hybrid's perplexity and KL to the backbone (and, with ``skip``, the skip
    control's perplexity) on ``lm_windows`` of them (:func:`validation_subset`). The bridge is
    given the exact sink state as the hybrid gives it, i.e. with sink passthrough.

    Bridgeability is one bridge pass per window, the language-model measures a full pass of
    the upper stack and one of the backbone, with a vocabulary-sized head: the cheap measure
    takes every window, the costly ones a seeded subset (``sweep.eval_sequences``)."""
    recon = bridge_reconstruction(bridge, valid.states[0], valid.states[layer], valid.mask,
                                  spec.sample_steps, batch_size, sink=spec.sink_passthrough)
    scored_windows = validation_subset(valid.sequences, lm_windows)
    hybrid = HybridLM(backbone, bridge, layer, sink_passthrough=spec.sink_passthrough, steps=spec.sample_steps)
    scored = hybrid_against_backbone(backbone, hybrid, scored_windows, batch_size)
    measured = {
        "bridge_mse": recon["mse"],
        "bridge_mse_trace": recon["mse_trace"],
        "bridge_r2": recon["r2"],
        "hybrid_ppl": scored["ppl"],
        "kl_to_backbone": scored["kl"],
    }
    if skip:
        measured["skip_ppl"] = teacher_forced_nll(skip_control(backbone, layer).logits, scored_windows, batch_size)["ppl"]
    return measured
