"""The backbone contract: a pretrained causal LM whose layer stack can be entered midway.

Hidden-state indexing follows Hugging Face: index 0 is the embedding output, index ℓ
(1 ≤ ℓ ≤ L) is the output of decoder layer ℓ (the input of layer ℓ+1), *before* the final
norm. Resuming from index ℓ runs layers ℓ+1..L, the final norm and the LM head.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from dihal_bench.errors import DihalError


def check_layer_index(name: str, num_layers: int, layer: int, *, allow_last: bool = False) -> int:
    """``layer`` as a hidden-state index a bridge may replace up to: 1..L-1 (the hybrid keeps at
    least one upper layer), or 1..L with ``allow_last``."""
    top = num_layers if allow_last else num_layers - 1
    if not 1 <= layer <= top:
        raise DihalError(f"layer {layer} is out of range for {name}: choose 1..{top} ({num_layers} layers)")
    return layer


@dataclass(frozen=True)
class BackboneShape:
    """A backbone's depth and width, as its plugin states them without loading weights (the
    ``describe`` meta key, docs/plugins.md) or as a loaded backbone has them: what a layer
    index or a channel count is checked against before a slow load, and again after it."""

    name: str
    num_layers: int
    width: int

    @classmethod
    def of(cls, backbone: Backbone) -> BackboneShape:
        return cls(backbone.name, backbone.num_layers, backbone.width)

    def check_layer(self, layer: int, *, allow_last: bool = False) -> int:
        return check_layer_index(self.name, self.num_layers, layer, allow_last=allow_last)


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
    def context_length(self) -> int | None:
        """The most positions the model takes (its trained context), or None if unknown."""
        return None

    @property
    def sliding_window(self) -> int | None:
        """Width of local attention where some layers use it (Gemma3), else None."""
        return None

    @abstractmethod
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden state index 0 for ``input_ids`` (B, T) -> (B, T, d)."""

    @abstractmethod
    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        up_to: int | None = None,
    ) -> list[torch.Tensor]:
        """Hidden states from one forward pass, each (B, T, d): all L+1 of them, or with
        ``up_to=l`` only [h_0, ..., h_l] from the embedding and layers 1..l, exactly equal to
        the first l+1 of the full list, at a cost proportional to l. Implementations check
        ``up_to`` with :meth:`check_up_to`."""

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

    def logits_and_final_hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`logits` and :meth:`final_hidden` together. Here two passes; a backbone that
        can take both from one pass should, since every evaluator pass of the metrics needs
        both (Gen.PPL reads the logits, MAUVE the final hidden state)."""
        return self.logits(input_ids, attention_mask), self.final_hidden(input_ids, attention_mask)

    def check_layer(self, layer: int, *, allow_last: bool = False) -> int:
        return check_layer_index(self.name, self.num_layers, layer, allow_last=allow_last)

    def check_up_to(self, up_to: int | None) -> int:
        """The number of decoder layers a :meth:`hidden_states` call runs: ``up_to``, or L for None."""
        if up_to is None:
            return self.num_layers
        try:
            # bool is an int subclass, but a True/False depth is always a caller's bug
            depth = None if isinstance(up_to, bool) else operator.index(up_to)
        except TypeError:
            depth = None
        if depth is None or not 0 <= depth <= self.num_layers:
            raise DihalError(f"up_to={up_to!r} is out of range for {self.name}: choose 0..{self.num_layers} "
                             f"({self.num_layers} layers)")
        return depth

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
