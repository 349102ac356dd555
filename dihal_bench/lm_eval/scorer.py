"""What the lm-eval model scores with: the intact backbone or a hybrid, its tokenizer and device,
and the longest window scored at once.

A *scorer* is anything with ``.tokenizer``, ``.device``, ``.max_length`` and
``.logits(input_ids, attention_mask)`` returning next-token logits (B, T, V) for right-padded
ids. A `Backbone` and a `HybridLM` both have such ``logits``; `ModelScorer` adds the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from dihal_bench.api.backbone import Backbone
from dihal_bench.api.bridge import HiddenStateBridge
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.checkpoint import load_bridge_checkpoint, read_bridge_meta
from dihal_bench.hybrid.model import HybridLM, LowerStack
from dihal_bench.registry.resolve import load_backbone

#: the longest window scored by default: lm-eval's own fallback length, and a bound on the
#: (B, T, vocabulary) logits a CPU must hold when a model's context runs to 32k tokens or more
DEFAULT_MAX_LENGTH = 2048


class Scorer(Protocol):
    """What `DihalLM` needs of a model."""

    tokenizer: Any
    device: torch.device
    max_length: int

    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor: ...


@dataclass
class ModelScorer:
    """A `Backbone` or `HybridLM` (``model``) with the tokenizer, device and window length."""

    model: Backbone | HybridLM
    tokenizer: Any
    device: torch.device
    max_length: int
    name: str

    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.model.logits(input_ids, attention_mask)


def load_scorer(
    backbone: str | Backbone,
    *,
    layer: int | None = None,
    bridge: str | Path | LowerStack | None = None,
    steps: int | None = None,
    max_length: int | None = None,
    trust_unverified: bool = False,
    **backbone_options,
) -> ModelScorer:
    """The intact backbone, or the hybrid of ``backbone`` with ``bridge`` inserted at ``layer``.

    ``backbone`` is a `Backbone` or a name for `load_backbone` (which gets ``backbone_options``,
    e.g. device and dtype). ``bridge`` is a checkpoint directory (see `save_bridge_checkpoint`;
    it knows its layer) or a bridge object, which needs ``layer``. ``max_length`` defaults to
    the model's context length, at most `DEFAULT_MAX_LENGTH` and at most the longest input the
    bridge accepts. A checkpoint whose bridge.json records no sha256 of its weights is refused
    unless ``trust_unverified``; its description is checked before any model loads.
    """
    if isinstance(bridge, (str, Path)):
        read_bridge_meta(bridge, trust_unverified=trust_unverified)
    if not isinstance(backbone, Backbone):
        backbone = load_backbone(str(backbone), **{k: v for k, v in backbone_options.items() if v is not None})
    if bridge is None:
        if layer is not None or steps is not None:
            raise DihalError("layer and steps describe a hybrid: give a bridge checkpoint as well")
        return ModelScorer(backbone, backbone.tokenizer, backbone.device,
                           window_length(backbone, None, max_length), backbone.name)
    if isinstance(bridge, (str, Path)):
        bridge, layer = load_bridge_checkpoint(bridge, backbone, layer=layer, trust_unverified=trust_unverified)
    elif layer is None:
        raise DihalError("a bridge object needs the layer it replaces: pass layer=<int>")
    hybrid = HybridLM(backbone, bridge, int(layer), steps=steps)
    return ModelScorer(hybrid, backbone.tokenizer, backbone.device,
                       window_length(backbone, bridge, max_length), f"{backbone.name}+bridge@{layer}")


def window_length(backbone: Backbone, bridge: LowerStack | None, requested: int | None) -> int:
    """The longest input scored at once: ``requested``, else the model's context length capped
    at `DEFAULT_MAX_LENGTH`; never more than the bridge's positions."""
    # a bare lower stack (the skip or oracle control) has no position limit of its own
    bridge_limit = bridge.max_len if isinstance(bridge, HiddenStateBridge) else None
    if requested is not None:
        requested = int(requested)
        if requested < 1:
            raise DihalError(f"max_length must be at least 1, got {requested}")
        if bridge_limit is not None and requested > bridge_limit:
            raise DihalError(f"max_length {requested} exceeds the bridge's {bridge_limit} positions")
        return requested
    return min(backbone.context_length or DEFAULT_MAX_LENGTH, DEFAULT_MAX_LENGTH, bridge_limit or DEFAULT_MAX_LENGTH)
