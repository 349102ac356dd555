"""The lm-evaluation-harness adapter: the intact backbone or a DiHAL hybrid as an lm-eval model.

`DihalLM` is registered in lm-eval's model registry as ``dihal`` when this module is imported,
so ``lm_eval.simple_evaluate(model="dihal", model_args="backbone=gemma3-270m,bridge=runs/b")``
works as well as :func:`run_lm_eval`. lm-eval is an optional extra: without it this module
still imports, and everything that needs it raises a `DihalError` with the install command.

The model is reached through a *scorer*, anything with ``.tokenizer``, ``.device``,
``.max_length`` and ``.logits(input_ids, attention_mask)`` returning next-token logits
(B, T, V) for right-padded ids. A `Backbone` and a `HybridLM` both have such ``logits``;
`ModelScorer` adds the rest.

Tokenisation follows lm-eval's Hugging Face model (``lm_eval.models.huggingface``):
contexts get the tokenizer's own special tokens, the empty context and the start of every
rolling document are conditioned on one prefix token (BOS, else EOS), and whole texts are
scored in lm-eval's rolling windows (``lm_eval.utils.get_rolling_token_windows``): each token
is predicted exactly once, every window holds at most ``max_length`` inputs, and the last
window gets the longest context that fits.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor
from tqdm.auto import tqdm

from dihal_bench.backbone import Backbone, load_backbone
from dihal_bench.bridge_io import load_bridge_checkpoint
from dihal_bench.corpus import canonical_split, load_corpus
from dihal_bench.errors import DihalError
from dihal_bench.hybrid import HybridLM, LowerStack, check_sampling, sample_next_token
from dihal_bench.records import write_json_atomic, write_text_atomic

try:
    import lm_eval
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
except ImportError:  # the optional extra is missing: DihalLM and run_lm_eval say how to install it
    lm_eval = None
    TemplateLM = object

INSTALL_HINT = 'lm-eval is not installed: pip install "dihal-bench[lm-eval]"'

#: the task name that `run_lm_eval` replaces with `local_task_config(corpus)`
LOCAL_TASK = "dihal-local"
#: metric -> lm-eval aggregation (lower is better for all three)
LOCAL_METRICS = {
    "word_perplexity": "weighted_perplexity",
    "byte_perplexity": "weighted_perplexity",
    "bits_per_byte": "bits_per_byte",
}

#: the longest window scored by default: lm-eval's own fallback length, and a bound on the
#: (B, T, vocabulary) logits a CPU must hold when a model's context runs to 32k tokens or more
DEFAULT_MAX_LENGTH = 2048
DEFAULT_MAX_GEN_TOKS = 256
GENERATION_OPTIONS = ("until", "max_gen_toks", "do_sample", "temperature", "top_p")



def require_lm_eval():
    """The `lm_eval` package, or a DihalError that says how to install it."""
    if lm_eval is None:
        raise DihalError(INSTALL_HINT)
    return lm_eval


# -- scorers ---------------------------------------------------------------------------------


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
    **backbone_options,
) -> ModelScorer:
    """The intact backbone, or the hybrid of ``backbone`` with ``bridge`` inserted at ``layer``.

    ``backbone`` is a `Backbone` or a name for `load_backbone` (which gets ``backbone_options``,
    e.g. device and dtype). ``bridge`` is a checkpoint directory (see `save_bridge_checkpoint`;
    it knows its layer) or a bridge object, which needs ``layer``. ``max_length`` defaults to
    the model's context length, at most `DEFAULT_MAX_LENGTH` and at most the longest input the
    bridge accepts.
    """
    if not isinstance(backbone, Backbone):
        backbone = load_backbone(str(backbone), **{k: v for k, v in backbone_options.items() if v is not None})
    if bridge is None:
        if layer is not None or steps is not None:
            raise DihalError("layer and steps describe a hybrid: give a bridge checkpoint as well")
        return ModelScorer(backbone, backbone.tokenizer, backbone.device,
                           _window_length(backbone, None, max_length), backbone.name)
    if isinstance(bridge, (str, Path)):
        bridge, layer = load_bridge_checkpoint(bridge, backbone, layer=layer)
    elif layer is None:
        raise DihalError("a bridge object needs the layer it replaces: pass layer=<int>")
    hybrid = HybridLM(backbone, bridge, int(layer), steps=steps)
    return ModelScorer(hybrid, backbone.tokenizer, backbone.device,
                       _window_length(backbone, bridge, max_length), f"{backbone.name}+bridge@{layer}")


def _window_length(backbone: Backbone, bridge: object | None, requested: int | None) -> int:
    """The longest input scored at once: ``requested``, else the model's context length capped
    at `DEFAULT_MAX_LENGTH`; never more than the bridge's positions (``bridge.max_len``)."""
    bridge_limit = getattr(bridge, "max_len", None)
    if requested is not None:
        requested = int(requested)
        if requested < 1:
            raise DihalError(f"max_length must be at least 1, got {requested}")
        if bridge_limit is not None and requested > bridge_limit:
            raise DihalError(f"max_length {requested} exceeds the bridge's {bridge_limit} positions")
        return requested
    config = getattr(getattr(backbone, "model", None), "config", None)
    context = next((getattr(config, a) for a in ("max_position_embeddings", "n_positions", "n_ctx")
                    if getattr(config, a, None)), None)
    return min(context or DEFAULT_MAX_LENGTH, DEFAULT_MAX_LENGTH, bridge_limit or DEFAULT_MAX_LENGTH)


# -- bridge checkpoints -----------------------------------------------------------------------


# -- the lm-eval model ------------------------------------------------------------------------


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
    ) -> "DihalLM":
        """The model that lm-eval's ``model_args`` describe (see `load_scorer`)."""
        scorer = load_scorer(backbone, layer=layer, bridge=bridge, steps=steps, max_length=max_length,
                             device=device, dtype=dtype)
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


# -- tasks and runs ---------------------------------------------------------------------------


def _cache_dir() -> Path:
    # the same root as the embedded backbones' cache (dihal_builtin.embedded)
    return Path(os.environ.get("DIHAL_BENCH_CACHE", Path.home() / ".cache" / "dihal-bench")) / "lm-eval"


def local_task_config(corpus_spec: str, split: str = "test", max_documents: int | None = None) -> dict:
    """An inline lm-eval task (``tasks=[config]``) scoring the rolling log-likelihood of each
    document of a corpus split: word and byte perplexity and bits per byte, as lm-eval's
    ``wikitext`` task does.

    The documents are written to a JSON-lines file named by its content hash under
    ``$DIHAL_BENCH_CACHE/lm-eval`` and referenced by absolute path (lm-eval resolves relative
    data paths against the working directory), so the task needs no download.
    """
    corpus = load_corpus(corpus_spec)
    split = canonical_split(split)
    documents = corpus.split(split)[:max_documents]
    if not documents:
        raise DihalError(f"corpus {corpus.name!r} has no documents in its {split} split")
    lines = "".join(json.dumps({"id": d.id, "text": d.text}, ensure_ascii=False) + "\n" for d in documents)
    directory = _cache_dir()
    data = directory / f"{hashlib.sha256(lines.encode('utf-8')).hexdigest()[:16]}.jsonl"
    if not data.is_file():
        write_text_atomic(data, lines)
    return {
        "task": LOCAL_TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data.resolve())}, "cache_dir": str((directory / "datasets").resolve())},
        "test_split": "test",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "text",  # a field name: the raw text, not a Jinja template
        "metric_list": [{"metric": metric, "aggregation": aggregation, "higher_is_better": False}
                        for metric, aggregation in LOCAL_METRICS.items()],
        "metadata": {"version": 1.0, "corpus": corpus.name, "split": split, "documents": len(documents)},
    }


def run_lm_eval(
    model_args: str | dict,
    tasks: list[str],
    *,
    limit: int | float | None = None,
    corpus: str = "stdlib-docs",
    batch_size: int = 8,
    out_dir: str | Path | None = None,
) -> dict:
    """Evaluate the model ``model_args`` describes (`DihalLM.from_model_args`) on lm-eval tasks.

    ``tasks`` are lm-eval task names (their data must be available locally when offline) and
    `LOCAL_TASK`, the held-out split of ``corpus`` (`local_task_config`). ``limit`` caps the
    documents per task (a fraction when below 1). Returns ``{"results": {task: {metric:
    value}}, "config": {...}}``; metrics under a filter other than lm-eval's "none" keep it as
    ``metric,filter``. Also written to ``out_dir/lm_eval.json`` when ``out_dir`` is given.

    Offline, set ``HF_DATASETS_OFFLINE=1`` before Python starts (``datasets`` reads it at
    import) so that tasks with cached data do not first try the Hub.
    """
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    if not tasks:
        raise DihalError("no lm-eval tasks given")
    named = [task for task in tasks if task != LOCAL_TASK]
    manager = TaskManager(include_defaults=bool(named))  # indexing lm-eval's own tasks takes seconds
    unknown = [task for task in named if task not in manager.all_tasks]
    if unknown:
        raise DihalError(f"unknown lm-eval task(s) {', '.join(unknown)}; list them with `lm-eval ls tasks`")
    specs = [local_task_config(corpus) if task == LOCAL_TASK else task for task in tasks]
    if isinstance(model_args, str):
        model_args = simple_parse_args_string(model_args)
    model = DihalLM.create_from_arg_obj({"batch_size": batch_size, **model_args})
    try:
        evaluated = lm_eval.simple_evaluate(model=model, tasks=specs, limit=limit, log_samples=False,
                                            bootstrap_iters=0, task_manager=manager)
    except ConnectionError as exc:  # what `datasets` raises for a task whose data is not cached
        raise DihalError(f"lm-eval could not load a task's data ({str(exc).splitlines()[0]}); "
                         "offline, only tasks whose data is already cached can run") from None
    summary = {
        "results": {task: _metrics(values) for task, values in evaluated["results"].items()},
        "config": {
            "model_args": {key: _describe(value) for key, value in model_args.items()},
            "model": model.get_model_info(),
            "tasks": list(tasks),
            "corpus": corpus if LOCAL_TASK in tasks else None,
            "limit": limit,
            "batch_size": model.batch_size,
            "samples": evaluated.get("n-samples", {}),
            "lm_eval_version": lm_eval.__version__,
        },
    }
    if out_dir is not None:
        write_json_atomic(Path(out_dir) / "lm_eval.json", summary)
    return summary


def _metrics(values: dict) -> dict[str, float]:
    """``{"word_perplexity,none": 3.2, "alias": ...}`` -> ``{"word_perplexity": 3.2}``: numeric
    metrics only (no stderr left as "N/A", no alias)."""
    metrics = {}
    for key, value in values.items():
        metric, comma, filter_name = key.partition(",")
        if comma and isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[metric if filter_name == "none" else key] = float(value)
    return metrics


def _describe(value):
    """A model argument as JSON: objects (a backbone, a bridge) by their name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    return getattr(value, "name", type(value).__name__)


# -- folding results into a run record --------------------------------------------------------


def model_args_from_record(record: dict, method: str, seed: int | None = None) -> tuple[dict, int]:
    """lm-eval model args for one method of a run record: the backbone for ``ar-backbone``, the
    trained hybrid (backbone, layer, bridge checkpoint) for a ``dihal-*`` method."""
    runs = record["per_seed"]
    entry = next((r for r in runs if seed is None or r["seed"] == seed), None)
    if entry is None:
        raise DihalError(f"the record has no seed {seed}; it has {[r['seed'] for r in runs]}")
    if method not in entry["methods"]:
        raise DihalError(f"the record has no method {method!r}; it has {', '.join(entry['methods'])}")
    found = entry["methods"][method]
    if method == "ar-backbone":
        return {"backbone": record["backbone"]}, entry["seed"]
    if found.get("kind") != "dihal":
        raise DihalError(f"lm-eval scores next-token models: the backbone (ar-backbone) and DiHAL hybrids, "
                         f"not {method!r}, which generates whole sequences by diffusion")
    checkpoint = Path(found["train"]["checkpoint"])
    if not checkpoint.is_absolute() and not checkpoint.exists():  # stored relative to the job store
        checkpoint = Path(record["jobs"]) / checkpoint
    return {"backbone": record["backbone"], "layer": found["layer"], "bridge": str(checkpoint),
            "steps": record["config"]["bridge"]["sample_steps"]}, entry["seed"]


def attach_to_record(record_path: Path, method: str, seed: int, summary: dict) -> None:
    """Store ``summary`` as ``per_seed[seed].methods[method].lm_eval`` and rewrite the record atomically."""
    record = json.loads(Path(record_path).read_text())
    for entry in record["per_seed"]:
        if entry["seed"] == seed:
            entry["methods"][method]["lm_eval"] = summary["results"]
            entry["methods"][method]["lm_eval_config"] = summary["config"]
    write_json_atomic(Path(record_path), record)
