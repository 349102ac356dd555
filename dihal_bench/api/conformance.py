"""Conformance check for backbone plugins: can the layer stack be entered at every index, and
does a truncated pass (``hidden_states(..., up_to=ℓ)``) give what the full pass gives?"""

from __future__ import annotations

from pydoc_data.topics import topics

import torch

from dihal_bench.api.backbone import Backbone
from dihal_bench.errors import DihalError

#: relative to the largest |logit|, in float32
DEFAULT_TOLERANCE = 1e-4


def probe_batch(backbone: Backbone, min_tokens: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """Two texts of different lengths, right-padded, so masks and padding are exercised.

    The long one exceeds the sliding window (when the model has one) so that local
    attention layers are checked beyond their window too.
    """
    long_len = max(min_tokens, (backbone.sliding_window or 0) + 32)
    text = " ".join(topics[key] for key in sorted(topics))
    tokenizer = backbone.tokenizer
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:long_len]
    short = ids[: max(8, long_len // 3)]
    pad = tokenizer.pad_token_id
    input_ids = torch.full((2, long_len), pad, dtype=torch.long)
    mask = torch.zeros((2, long_len), dtype=torch.long)
    for row, seq in enumerate((ids, short)):
        input_ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return input_ids, mask


@torch.no_grad()
def check_backbone(backbone: Backbone, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """Max |logits(full) - logits(resumed from hidden state ℓ)| for every ℓ in 0..L, and max
    |h_ℓ(truncated at ℓ) - h_ℓ(full)| relative to max |h_ℓ|."""
    input_ids, mask = probe_batch(backbone)
    real = mask.bool().to(backbone.device)
    full = backbone.logits(input_ids, mask).float()
    scale = full[real].abs().max().item()
    states = backbone.hidden_states(input_ids, mask)
    diffs = []
    for layer, hidden in enumerate(states):
        resumed = backbone.resume(hidden, layer, mask).float()
        diffs.append((resumed - full)[real].abs().max().item())
    truncated = []
    for layer, hidden in enumerate(states):
        prefix = backbone.hidden_states(input_ids, mask, up_to=layer)
        if len(prefix) != layer + 1:
            raise DihalError(f"{backbone.name}: hidden_states(up_to={layer}) returned {len(prefix)} states, "
                             f"not {layer + 1}")
        reference = hidden[real].float()
        truncated.append(((prefix[layer][real].float() - reference).abs().max() / reference.abs().max()).item())
    worst = max(diffs)
    return {
        **backbone.describe(),
        "probe_tokens": int(mask.sum()),
        "logit_scale": scale,
        "tolerance": tolerance,
        "max_abs_diff": diffs,
        "worst_relative": worst / scale,
        "truncated_relative_diff": truncated,
        "passed": worst <= tolerance * scale and max(truncated) <= tolerance,
    }
