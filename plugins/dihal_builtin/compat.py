"""What the installed transformers release calls the pieces that the layer-entry backbone uses.

The backbone runs decoder layers itself (:mod:`dihal_builtin.hf_backbone`), so it passes
keyword arguments that transformers has renamed between releases:

- the cache: ``past_key_value`` (4.x up to 4.55), ``past_key_values`` (4.56-5.23), ``cache`` (5.24 on),
  in the decoder layers, the mask builders and the causal LM's forward;
- the mask builders' embeddings: ``input_embeds`` (up to 5.x's first releases), ``inputs_embeds`` later;
- ``cache_position``, which the masks and layers took until 5.x dropped it for ``position_ids``;
  and ``layer_idx``, which later mask builders take to find that layer's cache;
- Gemma3's rotary tables: in 4.x one module per attention kind (``rotary_emb``,
  ``rotary_emb_local``) and a decoder layer that takes both tables; in 5.x one module called
  with the layer type and a layer that takes its own table.

Each difference is found here from the installed signatures (once per function or layer
class), never from a version string: a release that renames nothing new keeps working,
and one that does is one place to change. The oldest release this supports is the first with
``transformers.masking_utils`` and ``DynamicCache(config=...)`` (4.56, see pyproject.toml).
"""

from __future__ import annotations

import inspect
from functools import cache

import torch
import transformers
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from dihal_bench.errors import DihalError

#: the cache's keyword, newest name first
_CACHE_NAMES = ("cache", "past_key_values", "past_key_value")
_MASK_BUILDERS = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
#: the attention kinds a backbone may have: those the library builds masks for
LAYER_KINDS = tuple(_MASK_BUILDERS)


def _parameters(function) -> dict:
    return dict(inspect.signature(function).parameters)


def _cache_name(parameters: dict, what: str) -> str:
    try:
        return next(name for name in _CACHE_NAMES if name in parameters)
    except StopIteration:
        raise DihalError(f"{what} takes no cache argument (none of {', '.join(_CACHE_NAMES)}): "
                         "an unsupported transformers release") from None


@cache
def _mask_spec() -> tuple[str, str, bool, bool]:
    """(embeddings keyword, cache keyword, takes cache_position, takes layer_idx) of the mask builders."""
    parameters = _parameters(create_causal_mask)
    embeds = "inputs_embeds" if "inputs_embeds" in parameters else "input_embeds"
    return (embeds, _cache_name(parameters, "create_causal_mask"), "cache_position" in parameters,
            "layer_idx" in parameters)


def build_mask(kind: str, config, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
               cache_object, positions: torch.Tensor, layer_idx: int):
    """The library's attention mask for layers of ``kind`` (``full_attention`` or
    ``sliding_attention``), ``layer_idx`` the first such layer; ``positions`` (1, T)."""
    embeds, cache_name, takes_cache_position, takes_layer_idx = _mask_spec()
    kwargs = {"config": config, embeds: hidden, "attention_mask": attention_mask, cache_name: cache_object,
              "position_ids": positions}
    if takes_cache_position:
        # the library's own forward passes arange(past, past + T) here, which is `positions`
        kwargs["cache_position"] = positions[0]
    if takes_layer_idx:
        kwargs["layer_idx"] = layer_idx
    elif cache_object is not None:
        # Earlier builders read the sizes of the cache's first layer of this kind, which a backbone
        # entered at a later layer never fills: show them the entered layer instead
        kwargs[cache_name] = _LayerView(cache_object, layer_idx, kind == "sliding_attention")
    return _MASK_BUILDERS[kind](**kwargs)


class _LayerView:
    """A cache as a mask builder without ``layer_idx`` reads it: one layer, ``layer``, of its kind
    (the builder takes the first index of its kind in ``is_sliding``, which here is that layer)."""

    def __init__(self, cache_object, layer: int, sliding: bool):
        self._cache, self._layer, self.is_sliding = cache_object, layer, [sliding]

    def get_mask_sizes(self, cache_position, layer_idx):
        return self._cache.get_mask_sizes(cache_position, self._layer)

    def __getattr__(self, name):
        return getattr(self._cache, name)


def rotary_tables(base, hidden: torch.Tensor, positions: torch.Tensor, kind: str):
    """The (cos, sin) tables for layers of ``kind``: one module called with the layer type
    where it takes one, else Gemma3-4.x's local module for sliding layers, else the one module."""
    rotary = base.rotary_emb
    if "layer_type" in _parameters(rotary.forward):
        return rotary(hidden, positions, kind)
    if kind == "sliding_attention" and hasattr(base, "rotary_emb_local"):
        return base.rotary_emb_local(hidden, positions)
    return rotary(hidden, positions)


@cache
def _layer_spec(layer_class: type) -> tuple[str, bool, bool]:
    """(cache keyword, takes both rotary tables, takes cache_position) of a decoder layer class."""
    parameters = _parameters(layer_class.forward)
    return (_cache_name(parameters, f"{layer_class.__name__}.forward"),
            "position_embeddings_global" in parameters, "cache_position" in parameters)


def run_layer(layer, hidden: torch.Tensor, *, mask, rotary: dict, kind: str, positions: torch.Tensor, cache_object):
    """One decoder layer's forward with this release's keywords; ``rotary`` maps each layer kind
    that :func:`needs_all_rotaries` asks for to its tables. Returns the hidden state."""
    cache_name, both_tables, takes_cache_position = _layer_spec(type(layer))
    kwargs = {"attention_mask": mask, "position_ids": positions, cache_name: cache_object,
              "use_cache": cache_object is not None}
    if both_tables:
        # Gemma3 in 4.x: the layer picks the global or the local table itself
        kwargs["position_embeddings_global"] = rotary["full_attention"]
        kwargs["position_embeddings_local"] = rotary["sliding_attention"]
    else:
        kwargs["position_embeddings"] = rotary[kind]
    if takes_cache_position:
        kwargs["cache_position"] = positions[0]
    out = layer(hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def needs_all_rotaries(layers) -> bool:
    """Whether these decoder layers take both kinds' rotary tables (Gemma3 in 4.x)."""
    return any(_layer_spec(type(layer))[1] for layer in layers)


def new_cache(config) -> DynamicCache:
    """An empty key/value cache laid out per layer from ``config`` (sliding layers keep a window)."""
    return DynamicCache(config=config)


def cache_keyword(model) -> str:
    """The cache's keyword in a causal LM's own forward (for callers that decode step by step)."""
    return _cache_name(_parameters(type(model).forward), f"{type(model).__name__}.forward")


def describe() -> str:
    """The names found in the installed release, for a test report's header."""
    embeds, cache_name, takes_cache_position, takes_layer_idx = _mask_spec()
    return (f"transformers {transformers.__version__}: mask builders take {embeds}, {cache_name}"
            f"{', cache_position' if takes_cache_position else ''}{', layer_idx' if takes_layer_idx else ''}")


def file_format_line() -> str:
    """The transformers major release, for keying files it writes (a saved tokenizer's config):
    the one place a version, not a signature, decides, since a file's format has no signature."""
    return transformers.__version__.split(".")[0]
