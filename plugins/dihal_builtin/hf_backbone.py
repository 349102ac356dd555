"""A Hugging Face transformers backbone that can be entered at any layer.

Works for causal LMs with the usual ``model.model.{embed_tokens, layers, norm, rotary_emb}``
layout: Llama, Qwen2/Qwen3, Gemma3 (text), Mistral and relatives. We run the decoder
layers ourselves, with the library's own mask builders and rotary embeddings, so
that the layer stack can start at any index; ``dihal-bench check backbone`` compares
the result against the library's own forward pass.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from dihal_bench.api.backbone import Backbone
from dihal_bench.errors import DihalError
from dihal_builtin import compat

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise DihalError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}") from None


def describe_pretrained(model_id: str, *, trust_remote_code: bool = False) -> dict:
    """Depth and width of a hub id or local model directory from its ``config.json`` alone
    (the backbone plugin's ``describe``): the numbers the loaded :class:`HFBackbone` reports."""
    try:
        config = AutoConfig.from_pretrained(model_id, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise DihalError(f"cannot load backbone {model_id!r}: {str(exc).splitlines()[0]}") from None
    # a multimodal checkpoint nests the decoder's settings; the causal LM is built from those
    text = config.get_text_config()
    return {"layers": text.num_hidden_layers, "width": text.hidden_size}


def pretrained_parameters(model_id: str) -> int | None:
    """The parameter count of a local model directory from its safetensors files' headers (no
    weights read; a tied embedding is stored, and counted, once), or None for a hub id or a
    directory without safetensors: the dry run's estimate then falls back to the size in the name."""
    files = sorted(Path(model_id).glob("*.safetensors")) if Path(model_id).is_dir() else []
    if not files:
        return None
    count = 0
    for file in files:
        with safe_open(file, framework="pt") as tensors:
            count += sum(math.prod(tensors.get_slice(key).get_shape()) for key in tensors.keys())
    return count or None


def pretrained_tokenizer(model_id: str, *, gguf_file: str | None = None, trust_remote_code: bool = False):
    """The tokenizer of a hub id or local model directory (a GGUF file's, with ``gguf_file``),
    without the model's weights."""
    options = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        return AutoTokenizer.from_pretrained(model_id, trust_remote_code=trust_remote_code, **options)
    except (OSError, ValueError) as exc:  # missing files; a directory that holds no model
        raise DihalError(f"cannot load backbone {model_id!r}: {str(exc).splitlines()[0]}") from None


def load_pretrained(
    model_id: str,
    *,
    gguf_file: str | None = None,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    device_map: str | None = None,
    trust_remote_code: bool = False,
):
    """(causal LM, tokenizer) from a hub id or a local directory; ``device_map="auto"`` shards over GPUs."""
    kwargs = dict(dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if device_map:
        kwargs["device_map"] = device_map
    tokenizer = pretrained_tokenizer(model_id, gguf_file=gguf_file, trust_remote_code=trust_remote_code)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_id, **kwargs)
    except (OSError, ValueError) as exc:  # missing files; a directory that holds no model
        raise DihalError(f"cannot load backbone {model_id!r}: {str(exc).splitlines()[0]}") from None
    if not device_map:
        model = model.to(device)
    return model, tokenizer


def enterable(model) -> bool:
    """Whether ``HFBackbone`` can run ``model``'s layers itself (the Llama/Qwen/Gemma layout)."""
    base = getattr(model, "model", None)
    return base is not None and all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))


def evaluator_from_pretrained(model_id: str, *, name: str | None = None, **options):
    """A suite's evaluator from a hub id or a local directory (the ``hf`` backbone's ``evaluator``
    hook): an :class:`HFBackbone` where its layout allows one, as before, else the whole causal LM
    (:class:`HFEvaluator`). **Why:** the metrics read only the logits and the final state, so a
    scorer need not be enterable midway, and the field's scorer, GPT-2, is not."""
    model, tokenizer = load_pretrained(model_id, **options)
    return (HFBackbone if enterable(model) else HFEvaluator)(model, tokenizer, name or model_id)


class HFEvaluator:
    """A Hugging Face causal LM that only scores and featurises text (the metrics' ``Evaluator``,
    ``dihal_bench.api.metrics``), for a layout :class:`HFBackbone` cannot enter: GPT-2's
    ``transformer.{wte, wpe, h, ln_f}``, GPT-NeoX, OPT and the like."""

    def __init__(self, model, tokenizer, name: str):
        self.name = name
        self.model = model.eval().requires_grad_(False)
        self.base = model.base_model
        self.tokenizer = tokenizer
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        config = model.config.get_text_config()
        self.context_length = next((getattr(config, key) for key in ("max_position_embeddings", "n_positions", "n_ctx")
                                    if getattr(config, key, None)), None)

    def _checked(self, input_ids: torch.Tensor) -> torch.Tensor:
        # GPT-2's positions are a learned table of n_positions rows: a longer input is an index
        # error inside torch on a CPU, and a device-side assert that ends the process on a GPU
        if self.context_length is not None and input_ids.shape[1] > self.context_length:
            raise DihalError(f"evaluator {self.name}: an input of {input_ids.shape[1]} tokens, but it takes at most "
                             f"{self.context_length}; set metrics.max_length to {self.context_length} or less")
        return input_ids.to(self.device)

    @torch.no_grad()
    def final_hidden(self, input_ids, attention_mask=None):
        mask = attention_mask.to(self.device) if attention_mask is not None else None
        return self.base(input_ids=self._checked(input_ids), attention_mask=mask, use_cache=False).last_hidden_state

    @torch.no_grad()
    def logits_and_final_hidden(self, input_ids, attention_mask=None):
        # The logits of the library's own forward, whatever its head does after the final state;
        # that state is the base model's output, caught on the way: one pass, no copy of every layer
        mask = attention_mask.to(self.device) if attention_mask is not None else None
        caught = []
        hook = self.base.register_forward_hook(lambda module, args, output: caught.append(output[0]))
        try:
            logits = self.model(input_ids=self._checked(input_ids), attention_mask=mask, use_cache=False).logits
        finally:
            hook.remove()
        return logits, caught[-1]


class HFBackbone(Backbone):
    def __init__(self, model, tokenizer, name: str):
        base = getattr(model, "model", None)
        if not enterable(model):
            raise DihalError(
                f"{name}: unsupported architecture {type(model).__name__}; expected model.model with "
                "embed_tokens, layers, norm and rotary_emb (Llama/Qwen/Gemma-style)"
            )
        self.name = name
        self.model = model.eval().requires_grad_(False)
        self.base = base
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        config = base.config
        self.layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers)
        self._all_rotaries = compat.needs_all_rotaries(base.layers)
        self._softcap = getattr(model.config, "final_logit_softcapping", None)

    @classmethod
    def from_pretrained(
        cls,
        model_id: str,
        *,
        name: str | None = None,
        gguf_file: str | None = None,
        device: str = "cpu",
        dtype: str | torch.dtype = "float32",
        device_map: str | None = None,
        trust_remote_code: bool = False,
    ) -> "HFBackbone":
        """Load from a hub id or a local directory; ``device_map="auto"`` shards over GPUs."""
        model, tokenizer = load_pretrained(model_id, gguf_file=gguf_file, device=device, dtype=dtype,
                                           device_map=device_map, trust_remote_code=trust_remote_code)
        return cls(model, tokenizer, name or model_id)

    # -- shape -----------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.base.config.num_hidden_layers

    @property
    def width(self) -> int:
        return self.base.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def context_length(self) -> int | None:
        config = self.base.config
        return next((getattr(config, key) for key in ("max_position_embeddings", "n_positions", "n_ctx")
                     if getattr(config, key, None)), None)

    @property
    def sliding_window(self) -> int | None:
        if "sliding_attention" not in self.layer_types:
            return None
        return self.base.config.sliding_window

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # -- forward pieces ----------------------------------------------------------------------
    @torch.no_grad()
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Gemma's embedding module applies its sqrt(d) scale itself.
        return self.base.embed_tokens(input_ids.to(self.device))

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._capped(self.model.lm_head(self.base.norm(hidden)))

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        """Gemma's final soft cap, where the config sets one (the causal-LM forward applies it)."""
        return torch.tanh(logits / self._softcap) * self._softcap if self._softcap else logits

    def _run_layers(self, hidden, start, end, attention_mask, cache, position_offset, collect=None):
        """Run decoder layers start..end-1 (0-based) on ``hidden``."""
        hidden = hidden.to(self.device, self.dtype)
        positions = torch.arange(hidden.shape[1], device=self.device)[None] + position_offset
        if attention_mask is not None:
            attention_mask = attention_mask.to(self.device)
        masks, rotary = {}, {}
        for kind in dict.fromkeys(self.layer_types[start:end]):
            if kind not in compat.LAYER_KINDS:
                raise DihalError(f"{self.name}: unsupported layer type {kind!r}")
            first = next(i for i in range(start, end) if self.layer_types[i] == kind)
            masks[kind] = compat.build_mask(kind, self.base.config, hidden, attention_mask, cache, positions, first)
        # a layer that takes both kinds' tables gets both, whichever kinds the range holds
        kinds = compat.LAYER_KINDS if self._all_rotaries else masks
        for kind in kinds:
            rotary[kind] = compat.rotary_tables(self.base, hidden, positions, kind)
        for i in range(start, end):
            kind = self.layer_types[i]
            hidden = compat.run_layer(self.base.layers[i], hidden, mask=masks[kind], rotary=rotary, kind=kind,
                                      positions=positions, cache_object=cache)
            if collect is not None:
                collect.append(hidden)
        return hidden

    @torch.no_grad()
    def hidden_states(self, input_ids, attention_mask=None, *, up_to=None):
        depth = self.check_up_to(up_to)
        states = [self.embed(input_ids)]
        # The masks and rotary tables are built for the layer kinds among the first `depth`
        # layers only; each layer's computation is the same as in the full pass.
        self._run_layers(states[0], 0, depth, attention_mask, None, 0, collect=states)
        return states

    @torch.no_grad()
    def resume(self, hidden, layer, attention_mask=None, cache=None, position_offset=0):
        hidden = self._run_layers(hidden, layer, self.num_layers, attention_mask, cache, position_offset)
        return self._head(hidden)

    def new_cache(self):
        return compat.new_cache(self.base.config)

    @torch.no_grad()
    def logits(self, input_ids, attention_mask=None):
        mask = attention_mask.to(self.device) if attention_mask is not None else None
        return self.model(input_ids=input_ids.to(self.device), attention_mask=mask, use_cache=False).logits

    @torch.no_grad()
    def final_hidden(self, input_ids, attention_mask=None):
        mask = attention_mask.to(self.device) if attention_mask is not None else None
        return self.base(input_ids=input_ids.to(self.device), attention_mask=mask, use_cache=False).last_hidden_state

    @torch.no_grad()
    def logits_and_final_hidden(self, input_ids, attention_mask=None):
        # The library's own head applied to the library's own final state: the same operations
        # as the causal-LM forward (lm_head, then Gemma's soft cap where set), one body pass.
        hidden = self.final_hidden(input_ids, attention_mask)
        return self._capped(self.model.lm_head(hidden)), hidden
