"""The backbone contract: a pretrained causal LM whose layer stack can be entered midway.

Hidden-state indexing follows Hugging Face: index 0 is the embedding output, index ℓ
(1 ≤ ℓ ≤ L) is the output of decoder layer ℓ (the input of layer ℓ+1), *before* the final
norm. Resuming from index ℓ runs layers ℓ+1..L, the final norm and the LM head.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch

from dihal_bench.errors import DihalError, unknown_name


class Backbone(ABC):
    """A frozen decoder-only LM with access to every layer's hidden state."""

    name: str
    tokenizer: object  # a Hugging Face tokenizer
    device: torch.device
    dtype: torch.dtype

    @property
    @abstractmethod
    def num_layers(self) -> int: ...

    @property
    @abstractmethod
    def width(self) -> int: ...

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def num_parameters(self) -> int: ...

    @property
    def sliding_window(self) -> int | None:
        """Width of local attention where some layers use it (Gemma3), else None."""
        return None

    @abstractmethod
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden state index 0 for ``input_ids`` (B, T) -> (B, T, d)."""

    @abstractmethod
    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """All L+1 hidden states from one forward pass, each (B, T, d)."""

    @abstractmethod
    def resume(
        self,
        hidden: torch.Tensor,
        layer: int,
        attention_mask: torch.Tensor | None = None,
        cache=None,
        position_offset: int = 0,
    ) -> torch.Tensor:
        """Logits (B, T, V) from hidden state index ``layer``: layers layer+1..L, norm, head.

        With a key/value ``cache`` (from :meth:`new_cache`), ``hidden`` holds only the new
        positions, which start at ``position_offset``.
        """

    @abstractmethod
    def new_cache(self):
        """An empty key/value cache for incremental :meth:`resume` calls."""

    @abstractmethod
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The intact model's logits, computed by the library's own forward pass."""

    @abstractmethod
    def final_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The last layer's hidden state after the final norm (the LM head's input)."""

    def check_layer(self, layer: int, *, allow_last: bool = False) -> int:
        top = self.num_layers if allow_last else self.num_layers - 1
        if not 1 <= layer <= top:
            raise DihalError(f"layer {layer} is out of range for {self.name}: choose 1..{top} ({self.num_layers} layers)")
        return layer

    def describe(self) -> dict:
        return {
            "name": self.name,
            "layers": self.num_layers,
            "width": self.width,
            "vocab": self.vocab_size,
            "parameters": self.num_parameters(),
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
        }


def load_backbone(name: str, **options) -> Backbone:
    """A registered backbone name, or any Hugging Face model id or local model directory."""
    from dihal_bench.plugins import get_registry

    registry = get_registry()
    if name in registry.items["backbone"]:
        return registry.get("backbone", name).obj(**options)
    if Path(name).exists() or _looks_like_hub_id(name):
        return registry.get("backbone", "hf").obj(model_id=name, **options)
    raise unknown_name("backbone", name, list(registry.items["backbone"]) + ["<hub id org/name>", "<local directory>"])


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/"))
