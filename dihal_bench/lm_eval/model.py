"""`DihalLM`: a scorer (``scorer.py``) as an lm-evaluation-harness model, registered in
lm-eval's model registry as ``dihal`` when this module is imported, so that
``lm_eval.simple_evaluate(model="dihal", model_args="backbone=gemma3-270m,bridge=runs/b")`` works.

lm-eval is an optional extra: without it this module still imports, and `DihalLM` raises a
`DihalError` with the install command.

Tokenisation follows lm-eval's Hugging Face model (``lm_eval.models.huggingface``):
contexts get the tokenizer's own special tokens, the empty context and the start of every
rolling document are conditioned on one prefix token (BOS, else EOS), and whole texts are
scored in lm-eval's rolling windows (``lm_eval.utils.get_rolling_token_windows``): each token
is predicted exactly once, every window holds at most ``max_length`` inputs, and the last
window gets the longest context that fits.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from dihal_bench.api.backbone import Backbone
from dihal_bench.api.sampling import check_sampling, sample_next_token
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.model import LowerStack
from dihal_bench.lm_eval.scorer import Scorer, load_scorer

try:
    import lm_eval
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import (
        get_rolling_token_windows,
        make_disjoint_window,
        simple_parse_args_string,
    )
except ImportError:  # the optional extra is missing: DihalLM and run_lm_eval say how to install it
    lm_eval = None
    TemplateLM = object

INSTALL_HINT = 'lm-eval is not installed: pip install "dihal-bench[lm-eval]"'

DEFAULT_MAX_GEN_TOKS = 256
GENERATION_OPTIONS = ("until", "max_gen_toks", "do_sample", "temperature", "top_p")


def require_lm_eval():
    """The `lm_eval` package, or a DihalError that says how to install it."""
    if lm_eval is None:
        raise DihalError(INSTALL_HINT)
    return lm_eval


class DihalLM(TemplateLM):
    """An lm-eval model over a `Scorer`: log-likelihoods from its logits, generation by a loop
    over them.

    ``batch_size`` sequences go through the scorer at once, right-padded (both scorers are
    causal, so padding never changes a real position). ``seed`` seeds sampled generation.
    """

    def __init__(self, scorer: Scorer, *, batch_size: int | str = 8, seed: int = 0):
        require_lm_eval()
        super().__init__()
        if not str(batch_size).isdigit() or int(batch_size) < 1:  # lm-eval's "auto" included: we do not probe memory
            raise DihalError(f"batch_size must be a positive integer, got {batch_size!r}")
        tokenizer = scorer.tokenizer
        if tokenizer.eos_token_id is None and tokenizer.bos_token_id is None:
            raise DihalError("the tokenizer has neither a BOS nor an EOS token to condition on")
        self.scorer, self.tokenizer = scorer, tokenizer
        self.batch_size, self.seed = int(batch_size), int(seed)
        self._device = scorer.device

    @classmethod
    def from_model_args(
        cls,
        backbone: str | Backbone,
        layer: int | None = None,
        bridge: str | Path | LowerStack | None = None,
        steps: int | None = None,
        max_length: int | None = None,
        batch_size: int | str = 8,
        seed: int = 0,
        device: str | None = None,
        dtype: str | None = None,
        max_batch_size: int | None = None,  # lm-eval passes it for automatic batch sizes, which we lack
        trust_unverified: bool = False,
    ) -> "DihalLM":
        """The model that lm-eval's ``model_args`` describe (see `load_scorer`)."""
        scorer = load_scorer(backbone, layer=layer, bridge=bridge, steps=steps, max_length=max_length,
                             trust_unverified=trust_unverified, device=device, dtype=dtype)
        return cls(scorer, batch_size=batch_size, seed=seed)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "DihalLM":
        """lm-eval's constructor: ``arg_dict`` from the user, ``additional_config`` from lm-eval
        itself (batch size, device; None where unset)."""
        args = {**arg_dict, **{key: value for key, value in (additional_config or {}).items() if value is not None}}
        known = [name for name in inspect.signature(cls.from_model_args).parameters]
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise DihalError(f"unknown dihal model args {', '.join(unknown)}; known: {', '.join(known)}")
        if "backbone" not in args:
            raise DihalError("dihal model args need backbone=<name>")
        return cls.from_model_args(**args)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "DihalLM":
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # -- tokens -------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and each rolling document are conditioned on: BOS, else EOS."""
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self.scorer.max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Token ids of ``string``; the tokenizer's own special tokens unless ``add_special_tokens`` is False."""
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens is not False, verbose=False)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def get_model_info(self) -> dict:
        """Merged by lm-eval into its results' ``config``."""
        return {"dihal_model": getattr(self.scorer, "name", type(self.scorer).__name__), "max_length": self.max_length}

    # -- log-likelihoods ----------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``requests`` are ``((context, continuation), context_ids, continuation_ids)`` from
        `TemplateLM.loglikelihood`."""
        answers = self._score([(context, continuation) for _, context, continuation in requests], disable_tqdm)
        for (key, _, _), answer in zip(requests, answers):
            self.cache_hook.add_partial("loglikelihood", key, answer)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """log p(text | prefix token) of each request's whole text, in rolling windows of at
        most ``max_length`` inputs (module docstring)."""
        windows, owners = [], []
        for index, (text,) in enumerate(request.args for request in requests):
            tokens = self.tok_encode(text, add_special_tokens=False)
            for window in get_rolling_token_windows(tokens, self.prefix_token_id, self.max_length, context_len=1):
                windows.append(make_disjoint_window(window))
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._score(windows, disable_tqdm)):
            totals[owner] += logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def _score(self, pairs: list[tuple[list[int], list[int]]], disable_tqdm: bool) -> list[tuple[float, bool]]:
        """(log p(continuation | context), is_greedy) for token-id pairs.

        The input is context + continuation minus its last token, cut on the left to
        ``max_length``; the last len(continuation) positions' logits score the continuation.
        Longest inputs first, so that each batch pads little.
        """
        inputs = []
        for context, continuation in pairs:
            if not context:
                raise DihalError("a continuation needs at least one context token to be scored from")
            if len(continuation) > self.max_length:
                raise DihalError(f"a continuation of {len(continuation)} tokens exceeds max_length {self.max_length}")
            inputs.append((context + continuation)[-(self.max_length + 1) : -1])
        order = sorted(range(len(pairs)), key=lambda i: -len(inputs[i]))
        answers: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        for start in tqdm(range(0, len(order), self.batch_size), desc="dihal log-likelihood",
                          disable=disable_tqdm, leave=False):
            batch = order[start : start + self.batch_size]
            logits = self._logits([inputs[i] for i in batch])
            for row, i in enumerate(batch):
                continuation = pairs[i][1]
                if not continuation:
                    continue
                end = len(inputs[i])
                logprobs = torch.log_softmax(logits[row, end - len(continuation) : end].float(), dim=-1)
                target = torch.tensor(continuation, device=logprobs.device)
                total = logprobs.gather(-1, target[:, None]).sum().item()
                answers[i] = (total, bool((logprobs.argmax(-1) == target).all()))
        return answers

    def _logits(self, sequences: list[list[int]]) -> Tensor:
        """Scorer logits (B, T, V) for token lists of different lengths, right-padded."""
        width = max(len(sequence) for sequence in sequences)
        ids = torch.zeros(len(sequences), width, dtype=torch.long)
        mask = torch.zeros(len(sequences), width, dtype=torch.long)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.tensor(sequence)
            mask[row, : len(sequence)] = 1
        return self.scorer.logits(ids.to(self.device), mask.to(self.device))

    # -- generation ---------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continue each context until a stop string, the EOS token or ``max_gen_toks`` tokens.

        Each step re-runs the scorer on the whole prefix (no key/value cache): simple, exact for
        any scorer, and slow only for long generations. Requests with the same options are
        batched. The text returned ends before the first stop string.
        """
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        groups: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(json.dumps(request.args[1], sort_keys=True, default=str), []).append(index)
        outputs = [""] * len(requests)
        progress = tqdm(total=len(requests), desc="dihal generate", disable=disable_tqdm, leave=False)
        for indices in groups.values():
            until, max_new, temperature, top_p = self._generation_options(requests[indices[0]].args[1])
            keep = self.max_length - max_new
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start : start + self.batch_size]
                contexts = [self.tok_encode(requests[i].args[0])[-keep:] or [self.prefix_token_id] for i in batch]
                texts = self._generate(contexts, until, max_new, temperature, top_p, generator)
                for i, text in zip(batch, texts):
                    outputs[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                progress.update(len(batch))
        progress.close()
        return outputs

    def _generation_options(self, options: dict) -> tuple[list[str], int, float, float]:
        """(stop strings, max new tokens, temperature, top_p) from lm-eval's ``gen_kwargs``."""
        unknown = sorted(set(options) - set(GENERATION_OPTIONS))
        if unknown:
            raise DihalError(f"unsupported generation options {unknown}; supported: {', '.join(GENERATION_OPTIONS)}")
        until = options.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(options.get("max_gen_toks", min(DEFAULT_MAX_GEN_TOKS, self.max_length - 1)))
        if not 1 <= max_new < self.max_length:
            raise DihalError(f"max_gen_toks must be in 1..{self.max_length - 1} (max_length {self.max_length}), got {max_new}")
        sampled = options.get("do_sample", False)
        temperature = float(options.get("temperature", 1.0)) if sampled else 0.0
        top_p = float(options.get("top_p", 1.0)) if sampled else 1.0
        check_sampling(temperature, top_p)
        return until, max_new, temperature, top_p

    def _generate(self, contexts: list[list[int]], until: list[str], max_new: int, temperature: float,
                  top_p: float, generator: torch.Generator) -> list[str]:
        sequences = [list(context) for context in contexts]
        generated: list[list[int]] = [[] for _ in contexts]
        active = list(range(len(contexts)))
        for _ in range(max_new):
            if not active:
                break
            logits = self._logits([sequences[i] for i in active])
            last = torch.tensor([len(sequences[i]) - 1 for i in active], device=logits.device)
            tokens = sample_next_token(logits[torch.arange(len(active)), last], temperature, top_p, generator)
            still = []
            for i, token in zip(active, tokens.tolist()):
                if token == self.eot_token_id:
                    continue
                sequences[i].append(token)
                generated[i].append(token)
                if not any(stop in self.tok_decode(generated[i]) for stop in until):
                    still.append(i)
            active = still
        return [cut_at_stop_strings(self.tok_decode(tokens), until) for tokens in generated]


def cut_at_stop_strings(text: str, until: list[str]) -> str:
    """``text`` up to (not including) the earliest occurrence of any stop string."""
    cut = min((text.find(stop) for stop in until if stop and stop in text), default=len(text))
    return text[:cut]


if lm_eval is not None:
    register_model("dihal")(DihalLM)
