"""The LoRA machinery both pretrained rivals (``ar_lora``, ``ar2diff_lora``) build on (Hu et al. 2021,
arXiv 2106.09685): the adapted copy of the backbone that leaves the shared backbone untouched, the
choice of rank and target modules from the parameter allowance, and the module that holds only the
adapter weights (docs/rivals.md).
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

import torch
from peft import LoraConfig, inject_adapter_in_model
from torch import Tensor, nn

from dihal_bench.api.backbone import Backbone
from dihal_bench.api.baseline import Baseline
from dihal_bench.api.likelihood import with_start
from dihal_bench.api.sampling import NEXT_TOKEN_PRECISION, check_sampling, special_ids
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.model import start_token_id
from dihal_bench.training.budget import Budget

from .common import parse_options, seeded_init

#: the target-module sets tried in this order, the first whose best rank fits the allowance wins:
#: every linear map of the decoder blocks (adapting all of them matters more than a high rank,
#: QLoRA, Dettmers et al. 2023, arXiv 2305.14314), then the attention maps, then LoRA's original
#: query and value projections (Hu et al. 2021, §7.1)
TARGET_SETS = ("all-linear", "attention", "query-value")
#: the leaf names of the query and value projections in the Hugging Face decoder layers
QUERY_VALUE = ("q_proj", "v_proj")
#: alpha per unit of rank when alpha is not set: the scale alpha/r is 2, as in the common r = 8, alpha = 16
DEFAULT_ALPHA_PER_RANK = 2.0


@dataclass(frozen=True)
class LoRAOptions:
    """The options of every LoRA rival; each one's options dataclass extends it."""

    rank: int | None = None  # None: the rank whose adapter count is closest to the allowance
    targets: str | None = None  # one of TARGET_SETS; None: the first that fits the allowance
    alpha: float | None = None  # LoRA's alpha (scale alpha/rank); None: 2·rank
    temperature: float = 1.0  # 0 is greedy
    top_p: float = 1.0  # nucleus; 1 keeps the whole vocabulary


# -- the adapted copy of the backbone ----------------------------------------------------------


def causal_lm(backbone: Backbone, method: str) -> nn.Module:
    """The backbone's Hugging Face causal LM (``model.model.layers`` layout), which the LoRA
    rivals adapt; a DihalError for a backbone without one."""
    model = getattr(backbone, "model", None)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(model, nn.Module) or not isinstance(layers, nn.ModuleList):
        raise DihalError(f"{method} adapts a Hugging Face causal LM with model.model.layers; backbone "
                         f"{backbone.name} ({type(backbone).__name__}) has none")
    return model


def decoder_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Every linear map inside the decoder layers, by its module name in ``model``, in order."""
    return {f"model.layers.{index}.{name}": module
            for index, layer in enumerate(model.model.layers)
            for name, module in layer.named_modules() if isinstance(module, nn.Linear)}


def target_names(linears: dict[str, nn.Linear], targets: str) -> list[str]:
    """The names of the linear maps of target set ``targets`` (see TARGET_SETS): the attention
    maps are those inside a layer's attention module (a name part holding "attn")."""
    if targets == "all-linear":
        return list(linears)
    if targets == "attention":
        return [name for name in linears if any("attn" in part for part in name.split(".")[3:-1])]
    return [name for name in linears if name.rsplit(".", 1)[-1] in QUERY_VALUE]


def adapter_size(linears: dict[str, nn.Linear], names: list[str], rank: int) -> int:
    """LoRA's trainable count over the maps ``names``: A (rank × in) and B (out × rank) each."""
    return rank * sum(linears[name].in_features + linears[name].out_features for name in names)


def choose_adapter(method: str, budget: Budget, linears: dict[str, nn.Linear], rank: int | None,
                   targets: str | None) -> tuple[str, int]:
    """(target set, rank): those given, else each target set of TARGET_SETS in turn (only the
    given one when set) with the rank whose count is closest to ``budget.param_allowance``,
    the first within its tolerance. Without an allowance: all-linear, rank 8."""
    candidates = [targets] if targets else list(TARGET_SETS)
    if rank is not None or budget.param_allowance is None:
        return candidates[0], rank or 8
    allowance, tried = budget.param_allowance, []
    for candidate in candidates:
        names = target_names(linears, candidate)
        if not names:
            continue
        per_rank = adapter_size(linears, names, 1)
        best = max(1, round(allowance / per_rank))
        total = adapter_size(linears, names, best)
        if abs(total - allowance) <= budget.allowance_tolerance * allowance:
            return candidate, best
        tried.append(f"{candidate} rank {best}: {total:,}")
    raise DihalError(f"{method}: no LoRA rank and target set lands within ±{budget.allowance_tolerance:.0%} of the "
                     f"allowance {allowance:,} ({'; '.join(tried) or 'no linear maps to adapt'}); set rank and targets")


def shared_weight_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s module tree whose parameters and buffers are the original tensors.

    Why: LoRA replaces the adapted linear maps by wrappers, in place. On the shared backbone that
    would change what every other method, the evaluator and the metrics run through; on a deep
    copy it would double the memory of the weights. A copied tree over the same (frozen) tensors
    costs nothing and leaves the original modules as they were.
    """
    shared = {id(tensor): tensor for tensor in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo=shared)


def adapted_copy(model: nn.Module, names: list[str], rank: int, alpha: float, seed: int) -> nn.Module:
    """A shared-weight copy of ``model`` with LoRA adapters (no dropout, no bias) on the linear
    maps ``names``, initialised from ``seed`` (A Kaiming-uniform, B zero: the adapted model
    starts equal to the backbone). Only the adapters are trainable; the copy is in eval mode."""
    lm = shared_weight_copy(model)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none", target_modules=names)
    with seeded_init(seed):
        lm = inject_adapter_in_model(config, lm)
    # float32 adapters on a bf16 backbone (peft casts the input to them): AdamW's small updates
    # would otherwise round away
    for parameter in lm.parameters():
        if parameter.requires_grad:
            parameter.data = parameter.data.float()
    return lm.eval()


class Adapters(nn.Module):
    """The LoRA weights of an adapted model and nothing else: what the optimizer, the training
    checkpoints and ``weights.safetensors`` see. Each adapted map appears once, its name's dots
    as underscores, holding its ``A`` and ``B`` projections (the adapted model's own modules)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.maps = nn.ModuleDict({
            name.replace(".", "_"): nn.ModuleDict({"A": module.lora_A["default"], "B": module.lora_B["default"]})
            for name, module in lm.named_modules() if hasattr(module, "lora_A") and "default" in module.lora_A
        })


def output_logits(lm: nn.Module, hidden: Tensor) -> Tensor:
    """Logits from final (post-norm) hidden states: the LM head, then the final soft cap where
    the config sets one (Gemma), as the causal-LM forward applies them."""
    logits = lm.get_output_embeddings()(hidden)
    cap = getattr(lm.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


# -- the shared part of both LoRA rivals ---------------------------------------------------------


class LoRABaseline(Baseline):
    """A rival that trains LoRA adapters on a private, shared-weight copy of the backbone's
    causal LM (see ``shared_weight_copy``): the backbone object the runner shares with every other
    method and the evaluator never changes.

    Subclasses name their options dataclass (a LoRAOptions) in ``options_class`` and implement
    ``training_data``, ``loss`` and ``sample``.
    """

    options_class: type[LoRAOptions] = LoRAOptions
    trains_through_backbone = True
    token_sampling_options = ("temperature", "top_p")
    draw_precision = NEXT_TOKEN_PRECISION

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        opts = self.settings = parse_options(self.name, self.options_class, options)
        check_sampling(opts.temperature, opts.top_p)
        if (opts.rank is not None and opts.rank < 1) or (opts.alpha is not None and opts.alpha <= 0):
            raise DihalError(f"{self.name}: rank must be at least 1 and alpha positive")
        if opts.targets is not None and opts.targets not in TARGET_SETS:
            raise DihalError(f"{self.name}: targets must be one of {', '.join(TARGET_SETS)}, got {opts.targets!r}")
        model = causal_lm(backbone, self.name)
        linears = decoder_linears(model)
        self.targets, self.rank = choose_adapter(self.name, budget, linears, opts.rank, opts.targets)
        names = target_names(linears, self.targets)
        if not names:
            raise DihalError(f"{self.name}: {backbone.name} has no linear maps of target set {self.targets!r}")
        self.alpha = opts.alpha or DEFAULT_ALPHA_PER_RANK * self.rank
        self.lm = adapted_copy(model, names, self.rank, self.alpha, seed)
        self.adapters = Adapters(self.lm)
        try:
            self.start = start_token_id(backbone.tokenizer)
        except DihalError as exc:
            raise DihalError(f"{self.name}: {exc}") from None
        self.banned = special_ids(backbone.tokenizer)

    def components(self) -> dict[str, nn.Module]:
        return {"adapters": self.adapters}

    def config(self) -> dict:
        return {**super().config(), "lora": self.lora_settings()}

    def lora_settings(self) -> dict:
        return {"targets": self.targets, "rank": self.rank, "alpha": self.alpha,
                "adapted_maps": len(self.adapters.maps)}

    def sampling_options(self) -> dict:
        return {"temperature": self.settings.temperature, "top_p": self.settings.top_p, "start_token": self.start,
                "lora": self.lora_settings()}

    def training_data(self, sequences: Tensor) -> dict[str, Tensor]:
        return {"ids": sequences.long()}

    def with_start(self, ids: Tensor) -> Tensor:
        """``ids`` (n, T) with the start token before them: (n, T + 1)."""
        return with_start(ids, self.start)

    def check_request(self, n: int, seq_len: int) -> None:
        """A DihalError unless ``n`` ≥ 1 and ``seq_len`` tokens and the start token fit the backbone's context."""
        if n < 1:
            raise DihalError(f"{self.name}: cannot sample {n} sequences: at least 1")
        limit = self.backbone.context_length
        if seq_len < 1 or (limit is not None and seq_len + 1 > limit):
            most = "" if limit is None else f" at most {limit - 1} with the start token in a context of {limit}"
            raise DihalError(f"{self.name}: cannot sample {seq_len} tokens: at least 1{most}")
