"""The lm-eval adapter on a tiny random-weight Llama: every score equals a log-softmax sum
computed here directly from the transformers model, rolling windows included; generation
stops at stop strings; the oracle hybrid reproduces the backbone; the local task runs
offline through lm-eval and its perplexities match a direct computation; standard errors and
the per-document sample logs that `run_lm_eval` and ``dihal-bench lm-eval`` write."""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import re
import statistics
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
from dihal_builtin.bridge import DihalBridge  # noqa: E402
from dihal_builtin.hf_backbone import HFBackbone  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

import dihal_bench  # noqa: E402
from dihal_bench.errors import DihalError  # noqa: E402
from dihal_bench.hybrid.checkpoint import load_bridge_checkpoint, save_bridge_checkpoint  # noqa: E402
from dihal_bench.lm_eval import (  # noqa: E402
    BOOTSTRAP_ITERS,
    INSTALL_HINT,
    DihalLM,
    load_scorer,
    local_task_config,
    model_args_from_record,
    run_lm_eval,
)
from dihal_bench.lm_eval.samples import json_safe, sample_line, sample_log_name, write_sample_logs  # noqa: E402
from dihal_bench.registry.resolve import load_corpus  # noqa: E402

CONTEXT = 64  # the tiny model's positions: texts below are longer, so rolling needs several windows
EOS = 1  # the character tokenizer's (conftest.py); it has no BOS, so EOS is the prefix token
TOL = 1e-4


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model(char_tokenizer) -> LlamaForCausalLM:
    """A 2-layer Llama whose vocabulary is exactly the character tokenizer's, so that every
    greedy token decodes to text."""
    config = LlamaConfig(
        vocab_size=len(char_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=CONTEXT,
        initializer_range=0.2, pad_token_id=0, eos_token_id=EOS, bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def backbone(model, char_tokenizer) -> HFBackbone:
    return HFBackbone(model, char_tokenizer, "tiny")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIHAL_BENCH_CACHE", str(tmp_path / "cache"))


def lm(backbone, **options) -> DihalLM:
    return DihalLM.from_model_args(backbone, **options)


def requests(kind: str, *arguments) -> list[Instance]:
    return [Instance(kind, {}, args if isinstance(args, tuple) else (args,), i) for i, args in enumerate(arguments)]


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


@torch.no_grad()
def token_logprobs(model, inputs: list[int]) -> torch.Tensor:
    """log p(· | inputs[:t+1]) at every position t, straight from transformers: (T, V)."""
    return torch.log_softmax(model(torch.tensor([inputs])).logits[0].float(), dim=-1)


def direct_loglikelihood(model, context: list[int], continuation: list[int]) -> float:
    logprobs = token_logprobs(model, context + continuation[:-1])[len(context) - 1 :]
    return sum(logprobs[t, token].item() for t, token in enumerate(continuation))


def reference_rolling(model, tokens: list[int], window: int) -> float:
    """The rolling log-likelihood written out independently: tokens are predicted in blocks of
    ``window``; each block reads the ``window`` inputs that end just before its last token
    (the prefix token stands before the text), so a block's first token sees one token of
    context and the final block sees as much as fits."""
    inputs = [EOS] + tokens
    total = 0.0
    for start in range(0, len(tokens), window):
        end = min(start + window, len(tokens))
        first = max(0, end - window)
        logprobs = token_logprobs(model, inputs[first:end])
        total += sum(logprobs[j - first, tokens[j]].item() for j in range(start, end))
    return total


def greedy_tokens(model, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(token_logprobs(model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


def printable_greedy_prompt(model, tokenizer, n: int) -> tuple[str, list[int]]:
    """A short prompt whose first ``n`` greedy tokens are all characters (no special token),
    found by trying prompts in a fixed order."""
    for prompt in ("The", "a", "x =", "def", "Hello", "0", "z", "Q", "import"):  # no trailing space: lm-eval moves it
        generated = greedy_tokens(model, ids(tokenizer, prompt), n)
        if min(generated) > 2:
            return prompt, generated
    raise AssertionError("no prompt with a printable greedy continuation")


LONG_TEXT = "Rolling windows score each token exactly once, however long the text is. " * 2  # 148 tokens


# -- log-likelihoods --------------------------------------------------------------------------


def test_loglikelihood_is_the_direct_log_softmax_sum(model, backbone, char_tokenizer):
    tok = char_tokenizer
    prompt, greedy = printable_greedy_prompt(model, tok, 3)
    pairs = [("The cat", " sat on"), ("", "empty context"), (prompt, tok.decode(greedy)), ("The cat ", "sat on")]
    answers = lm(backbone).loglikelihood(requests("loglikelihood", *pairs))

    assert answers[0][0] == pytest.approx(direct_loglikelihood(model, ids(tok, "The cat"), ids(tok, " sat on")), abs=TOL)
    # an empty context is conditioned on the prefix token alone
    assert answers[1][0] == pytest.approx(direct_loglikelihood(model, [EOS], ids(tok, "empty context")), abs=TOL)
    assert answers[2] == (pytest.approx(direct_loglikelihood(model, ids(tok, prompt), greedy), abs=TOL), True)
    assert answers[0][1] is False  # a random model does not greedily continue "The cat" with " sat on"
    # a context's trailing space moves to the continuation
    assert answers[3] == pytest.approx(answers[0], abs=1e-6)


def test_rolling_loglikelihood_of_a_text_longer_than_the_context(model, backbone, char_tokenizer):
    tokens = ids(char_tokenizer, LONG_TEXT)
    assert len(tokens) > 2 * CONTEXT
    scorer = lm(backbone)
    assert scorer.max_length == CONTEXT  # from the model's max_position_embeddings
    (rolled,) = scorer.loglikelihood_rolling(requests("loglikelihood_rolling", LONG_TEXT))
    assert rolled == pytest.approx(reference_rolling(model, tokens, CONTEXT), abs=TOL)
    # not the score of one long window: the windows do cut the context
    assert abs(rolled - direct_loglikelihood(model, [EOS], tokens)) > 1e-2


def test_rolling_loglikelihood_within_one_window_is_the_plain_sum(model, backbone, char_tokenizer):
    text = "short text"
    (rolled,) = lm(backbone).loglikelihood_rolling(requests("loglikelihood_rolling", text))
    assert rolled == pytest.approx(direct_loglikelihood(model, [EOS], ids(char_tokenizer, text)), abs=TOL)


@pytest.mark.parametrize("window", [1, 7])
def test_rolling_windows_of_any_length(model, backbone, char_tokenizer, window):
    text = LONG_TEXT[:40]
    (rolled,) = lm(backbone, max_length=window).loglikelihood_rolling(requests("loglikelihood_rolling", text))
    assert rolled == pytest.approx(reference_rolling(model, ids(char_tokenizer, text), window), abs=TOL)


def test_batching_does_not_change_the_numbers(backbone):
    pairs = [("a", "b"), ("The quick brown", " fox jumps"), ("x", " = 1 + 2"), ("", "lone"), ("Hello, ", "world")]
    texts = [LONG_TEXT, "tiny", LONG_TEXT[:70], "mid-sized text here"]
    one, eight = lm(backbone, batch_size=1), lm(backbone, batch_size=8)
    for a, b in zip(one.loglikelihood(requests("loglikelihood", *pairs)), eight.loglikelihood(requests("loglikelihood", *pairs))):
        assert a[0] == pytest.approx(b[0], abs=1e-5) and a[1] == b[1]
    rolled_one = one.loglikelihood_rolling(requests("loglikelihood_rolling", *texts))
    rolled_eight = eight.loglikelihood_rolling(requests("loglikelihood_rolling", *texts))
    assert rolled_one == pytest.approx(rolled_eight, abs=1e-5)


def test_same_numbers_as_lm_evals_own_hugging_face_model(model, backbone, char_tokenizer):
    """lm-eval's HFLM on the same model and tokenizer is the reference implementation."""
    from lm_eval.models.huggingface import HFLM

    reference = HFLM(pretrained=model, tokenizer=char_tokenizer, max_length=16, batch_size=2, device="cpu")
    ours = lm(backbone, max_length=16)
    pairs = [("The cat", " sat on"), ("", "empty"), ("x ", "= 1")]
    texts = [LONG_TEXT, "short"]
    for a, b in zip(ours.loglikelihood(requests("loglikelihood", *pairs)),
                    reference.loglikelihood(requests("loglikelihood", *pairs))):
        assert a[0] == pytest.approx(b[0], abs=TOL) and a[1] == b[1]
    assert ours.loglikelihood_rolling(requests("loglikelihood_rolling", *texts)) == pytest.approx(
        reference.loglikelihood_rolling(requests("loglikelihood_rolling", *texts)), abs=TOL)
    prompts = [(prompt, {"until": [stop], "max_gen_toks": 8, "do_sample": False})
               for prompt, stop in (("The", ";"), ("a", "J"), ("import", "n"), ("Hello", "never"))]
    assert ours.generate_until(requests("generate_until", *prompts)) == reference.generate_until(
        requests("generate_until", *prompts))


# -- generation -------------------------------------------------------------------------------


class CountingScorer:
    """A scorer that counts its forward passes."""

    def __init__(self, scorer):
        self.inner, self.calls = scorer, 0
        self.tokenizer, self.device, self.max_length = scorer.tokenizer, scorer.device, scorer.max_length

    def logits(self, input_ids, attention_mask=None):
        self.calls += 1
        return self.inner.logits(input_ids, attention_mask)


def test_generate_until_stops_at_the_first_stop_string(model, backbone, char_tokenizer):
    prompt, greedy = printable_greedy_prompt(model, char_tokenizer, 12)
    text = char_tokenizer.decode(greedy)
    stop = text[5:7]
    expected = text[: text.find(stop)]
    scorer = CountingScorer(load_scorer(backbone))
    model_lm = DihalLM(scorer, batch_size=4)
    never = "longer than any output"
    (stopped,) = model_lm.generate_until(requests("generate_until", (prompt, {"until": [never, stop], "max_gen_toks": 12})))
    assert stopped == expected
    # it stopped as soon as the stop string was complete (one token per character)
    assert scorer.calls == len(expected) + len(stop)
    (full,) = model_lm.generate_until(requests("generate_until", (prompt, {"until": never, "max_gen_toks": 12})))
    assert full == text


def test_generate_until_batches_contexts_of_different_lengths(model, backbone, char_tokenizer):
    prompts = ["a", "The longer prompt ", "x = "]
    options = {"until": [], "max_gen_toks": 5}
    batched = DihalLM(load_scorer(backbone), batch_size=3).generate_until(
        requests("generate_until", *[(p, options) for p in prompts]))
    for prompt, text in zip(prompts, batched):
        tokens = greedy_tokens(model, ids(char_tokenizer, prompt), 5)
        assert text == char_tokenizer.decode(tokens[: tokens.index(EOS)] if EOS in tokens else tokens, skip_special_tokens=True)


def test_sampled_generation_is_seeded(backbone):
    options = {"until": [], "max_gen_toks": 8, "do_sample": True, "temperature": 1.0}
    first, second, other = (lm(backbone, seed=seed).generate_until(requests("generate_until", ("a", options)))
                            for seed in (3, 3, 4))
    assert first == second != other


def test_unsupported_generation_option_is_refused(backbone):
    with pytest.raises(DihalError, match="top_k"):
        lm(backbone).generate_until(requests("generate_until", ("a", {"until": [], "top_k": 5})))


# -- hybrids and bridge checkpoints ------------------------------------------------------------


def test_oracle_hybrid_gives_the_backbone_numbers(backbone):
    from dihal_bench.hybrid.model import OracleBridge

    pairs = [("The cat", " sat on"), ("", "a mat")]
    intact = lm(backbone)
    hybrid = lm(backbone, layer=1, bridge=OracleBridge(backbone, 1))
    assert hybrid.get_model_info()["dihal_model"] == "tiny+bridge@1"
    for a, b in zip(intact.loglikelihood(requests("loglikelihood", *pairs)), hybrid.loglikelihood(requests("loglikelihood", *pairs))):
        assert a[0] == pytest.approx(b[0], abs=TOL) and a[1] == b[1]
    texts = [LONG_TEXT, "short"]
    assert intact.loglikelihood_rolling(requests("loglikelihood_rolling", *texts)) == pytest.approx(
        hybrid.loglikelihood_rolling(requests("loglikelihood_rolling", *texts)), abs=TOL)


def tiny_bridge(width: int) -> DihalBridge:
    with torch.random.fork_rng():
        torch.manual_seed(5)
        return DihalBridge(width, d_model=16, layers=1, heads=2, steps=2, max_len=48)


def test_bridge_checkpoint_round_trip_and_model_args(tmp_path, backbone, char_tokenizer):
    bridge = tiny_bridge(backbone.width)
    save_bridge_checkpoint(bridge, "dihal-bridge", 1, backbone.name, tmp_path / "ckpt")
    meta = json.loads((tmp_path / "ckpt" / "bridge.json").read_text())
    weights_sha256 = hashlib.sha256((tmp_path / "ckpt" / "model.safetensors").read_bytes()).hexdigest()
    assert meta == {"name": "dihal-bridge", "config": bridge.config(), "layer": 1, "backbone": "tiny",
                    "weights_sha256": weights_sha256}

    loaded, layer = load_bridge_checkpoint(tmp_path / "ckpt", backbone)
    assert layer == 1
    for key, value in bridge.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)

    # the hybrid from lm-eval-style arguments scores with the checkpoint's bridge
    model = DihalLM.create_from_arg_obj({"backbone": backbone, "bridge": str(tmp_path / "ckpt"), "steps": 2},
                                        {"batch_size": 2, "device": None})
    assert model.max_length == 48  # the bridge's positions, below the backbone's 64
    from dihal_bench.hybrid.model import HybridLM

    text = "bridged text"
    expected = torch.log_softmax(HybridLM(backbone, bridge, 1, steps=2).logits(torch.tensor([[EOS] + ids(char_tokenizer, text)]))[0, :-1], -1)
    expected = sum(expected[t, token].item() for t, token in enumerate(ids(char_tokenizer, text)))
    assert model.loglikelihood_rolling(requests("loglikelihood_rolling", text)) == [pytest.approx(expected, abs=TOL)]


def test_bridge_checkpoint_mismatches_are_refused(tmp_path, backbone):
    save_bridge_checkpoint(tiny_bridge(backbone.width), "dihal-bridge", 1, "another-model", tmp_path / "other")
    save_bridge_checkpoint(tiny_bridge(backbone.width + 8), "dihal-bridge", 1, "tiny", tmp_path / "wide")
    save_bridge_checkpoint(tiny_bridge(backbone.width), "dihal-bridge", 1, "tiny", tmp_path / "ok")
    with pytest.raises(DihalError, match="trained on backbone 'another-model'"):
        load_bridge_checkpoint(tmp_path / "other", backbone)
    with pytest.raises(DihalError, match="width 40"):
        load_bridge_checkpoint(tmp_path / "wide", backbone)
    with pytest.raises(DihalError, match="not 1..2"):
        load_bridge_checkpoint(tmp_path / "ok", backbone, layer=2)
    with pytest.raises(DihalError, match="bridge.json is missing"):
        load_bridge_checkpoint(tmp_path, backbone)
    with pytest.raises(DihalError, match="exceeds the bridge's 48 positions"):
        load_scorer(backbone, bridge=tmp_path / "ok", max_length=60)


def test_model_args_are_checked(backbone):
    with pytest.raises(DihalError, match="unknown dihal model args layr"):
        DihalLM.create_from_arg_string("backbone=tiny,layr=2")
    with pytest.raises(DihalError, match="need backbone"):
        DihalLM.create_from_arg_string("layer=2")
    with pytest.raises(DihalError, match="give a bridge checkpoint"):
        load_scorer(backbone, layer=1)
    with pytest.raises(DihalError, match="needs the layer"):
        load_scorer(backbone, bridge=tiny_bridge(backbone.width))
    with pytest.raises(DihalError, match="positive integer"):
        DihalLM(load_scorer(backbone), batch_size="auto")


def test_a_records_intact_backbone_is_known_by_what_it_trained_not_by_its_name():
    methods = {
        "reference": {"kind": "baseline", "in_budget": False, "parameters": {}},
        "sed": {"kind": "baseline", "in_budget": True, "parameters": {"denoiser": 10}},
        "dihal-chosen": {"kind": "dihal", "in_budget": True, "layer": 2, "train": {"checkpoint": "/ckpt/bridge"}},
    }
    record = {"backbone": "tiny", "jobs": "/jobs", "config": {"bridge": {"sample_steps": 4}},
              "per_seed": [{"seed": 3, "methods": methods}]}
    assert model_args_from_record(record, "reference") == ({"backbone": "tiny"}, 3)
    assert model_args_from_record(record, "dihal-chosen") == (
        {"backbone": "tiny", "layer": 2, "bridge": "/ckpt/bridge", "steps": 4}, 3)
    with pytest.raises(DihalError, match=r"'sed' \(a trained baseline\) is neither"):
        model_args_from_record(record, "sed")


# -- lm-eval runs -----------------------------------------------------------------------------


@pytest.fixture
def text_corpus(tmp_path) -> str:
    """A directory of small .txt documents; a few of them fall in the test split."""
    directory = tmp_path / "docs"
    directory.mkdir()
    words = "the cat sat on a mat while dogs ran past slowly".split()
    for i in range(30):
        (directory / f"doc{i:02d}.txt").write_text(" ".join(words[(i + k * 3) % len(words)] for k in range(4 + i % 9)))
    return str(directory)


def expected_perplexities(model, tokenizer, corpus: str, window: int) -> dict[str, float]:
    """lm-eval's three rolling metrics computed here: word and byte perplexity are exp(−Σ log p /
    Σ words or bytes), bits per byte −Σ log p / (Σ bytes · ln 2); words as lm-eval counts them
    (pieces between runs of whitespace)."""
    documents = load_corpus(corpus).split("test")
    assert documents
    logprob = sum(reference_rolling(model, ids(tokenizer, d.text), window) for d in documents)
    words = sum(len(re.split(r"\s+", d.text)) for d in documents)
    nbytes = sum(len(d.text.encode("utf-8")) for d in documents)
    return {"word_perplexity": math.exp(-logprob / words), "byte_perplexity": math.exp(-logprob / nbytes),
            "bits_per_byte": -logprob / nbytes / math.log(2)}


def test_simple_evaluate_on_the_local_task_by_registered_name(model, backbone, char_tokenizer, text_corpus, cache):
    assert get_model("dihal") is DihalLM
    task = local_task_config(text_corpus)
    assert task["dataset_kwargs"]["data_files"]["test"].startswith("/")
    assert local_task_config(text_corpus, max_documents=1)["metadata"]["documents"] == 1
    results = lm_eval.simple_evaluate(
        model="dihal", model_args={"backbone": backbone, "max_length": 16}, tasks=[task], batch_size=3,
        log_samples=False, bootstrap_iters=0, task_manager=TaskManager(include_defaults=False),
    )["results"]["dihal-local"]
    expected = expected_perplexities(model, char_tokenizer, text_corpus, 16)
    for metric, value in expected.items():
        assert results[f"{metric},none"] == pytest.approx(value, rel=1e-5)


def read_jsonl(path) -> list[dict]:
    """A JSON-lines file as strict JSON (NaN and Infinity refused), every line ended by a newline."""
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")

    def refuse(constant):
        raise AssertionError(f"{path} holds {constant}: not strict JSON")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


SAMPLE_FIELDS = ["doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics"]


def test_run_lm_eval_summarises_and_writes_the_local_task(model, backbone, char_tokenizer, text_corpus, cache, tmp_path):
    summary = run_lm_eval({"backbone": backbone}, ["dihal-local"], corpus=text_corpus, batch_size=2,
                          out_dir=tmp_path / "out")
    expected = expected_perplexities(model, char_tokenizer, text_corpus, CONTEXT)
    # lm-eval has no standard error for weighted perplexities and bits per byte: no *_stderr key
    assert summary["results"]["dihal-local"] == pytest.approx(expected, rel=1e-5)
    assert summary["config"]["model_args"] == {"backbone": "tiny"}
    assert summary["config"]["model"] == {"dihal_model": "tiny", "max_length": CONTEXT}
    documents = load_corpus(text_corpus).split("test")
    assert summary["config"]["samples"]["dihal-local"] == {"original": len(documents), "effective": len(documents)}
    assert summary["config"]["bootstrap_iters"] == BOOTSTRAP_ITERS
    assert summary["config"]["sample_logs"] == {"dihal-local": "samples_dihal-local.jsonl"}
    assert json.loads((tmp_path / "out" / "lm_eval.json").read_text()) == summary
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["lm_eval.json", "samples_dihal-local.jsonl"]

    # one line per test document, in order, with what lm-eval scored and each metric's value for it
    lines = read_jsonl(tmp_path / "out" / "samples_dihal-local.jsonl")
    assert [line["doc_id"] for line in lines] == list(range(len(documents)))
    for line, document in zip(lines, documents):
        assert list(line)[: len(SAMPLE_FIELDS)] == SAMPLE_FIELDS
        assert line["doc"] == {"id": document.id, "text": document.text}
        assert line["arguments"] == [[document.text]]  # tuples became lists
        logprob = reference_rolling(model, ids(char_tokenizer, document.text), CONTEXT)
        assert line["resps"] == [[pytest.approx(logprob, abs=TOL)]]
        assert line["filtered_resps"] == [pytest.approx(logprob, abs=TOL)]
        assert (line["filter"], line["metrics"]) == ("none", ["word_perplexity", "byte_perplexity", "bits_per_byte"])
        nbytes = len(document.text.encode("utf-8"))
        assert line["word_perplexity"] == [pytest.approx(logprob, abs=TOL), len(re.split(r"\s+", document.text))]
        assert line["byte_perplexity"] == line["bits_per_byte"] == [pytest.approx(logprob, abs=TOL), nbytes]


def test_no_sample_logs_when_switched_off_or_without_an_output_folder(backbone, text_corpus, cache, tmp_path):
    summary = run_lm_eval({"backbone": backbone}, ["dihal-local"], corpus=text_corpus, limit=2,
                          out_dir=tmp_path / "off", log_samples=False)
    assert sorted(path.name for path in (tmp_path / "off").iterdir()) == ["lm_eval.json"]
    assert summary["config"]["sample_logs"] == {}
    assert run_lm_eval({"backbone": backbone}, ["dihal-local"], corpus=text_corpus, limit=2,
                       log_samples=True)["config"]["sample_logs"] == {}


@pytest.fixture
def user_tasks(tmp_path, monkeypatch) -> list[dict]:
    """A user's own lm-eval task with local data, a multiple-choice one (so lm-eval calls
    `loglikelihood`), visible to `run_lm_eval` in place of lm-eval's built-in index (which
    takes seconds to build and whose tasks' data is not here)."""
    questions = [
        {"question": "The cat sat on the", "choices": ["mat", "moon", "x"], "answer": 0},
        {"question": "1 + 1 =", "choices": ["2", "11", "two"], "answer": 2},
        {"question": "Hello", "choices": [", world", "!", " there"], "answer": 1},
    ]
    data = tmp_path / "tasks" / "tiny_choice.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(q) + "\n" for q in questions))
    task = {
        "task": "tiny_choice", "dataset_path": "json", "test_split": "test", "output_type": "multiple_choice",
        "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(tmp_path / "datasets")},
        "doc_to_text": "{{question}}", "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }
    (data.parent / "tiny_choice.yaml").write_text(json.dumps(task))  # JSON is YAML
    # a loglikelihood task: its perplexity is a metric lm-eval bootstraps, its acc one with a closed form
    pairs = data.parent / "tiny_next.jsonl"
    pairs.write_text("".join(json.dumps({"context": c, "continuation": t}) + "\n" for c, t in NEXT_PAIRS))
    (data.parent / "tiny_next.yaml").write_text(json.dumps({
        **task, "task": "tiny_next", "output_type": "loglikelihood", "dataset_kwargs": {
            "data_files": {"test": str(pairs)}, "cache_dir": str(tmp_path / "datasets")},
        "doc_to_text": "{{context}}", "doc_to_target": "{{continuation}}", "doc_to_choice": None,
        "metric_list": [{"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
                        {"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }))
    monkeypatch.setattr(lm_eval.tasks, "TaskManager",
                        lambda include_defaults: TaskManager(include_path=str(data.parent), include_defaults=False))
    return questions


#: (context, continuation) documents of the tiny_next task, scored as they stand (no space added)
NEXT_PAIRS = [("The cat", "sat"), ("1 + 1 =", "2"), ("Hello,", "world"), ("x =", "y"), ("def", "f():")]


def choice_correct(model, tokenizer, questions) -> list[float]:
    """Whether the tiny model puts the most likelihood on each question's answer, as lm-eval's acc."""
    correct = []
    for q in questions:
        # lm-eval joins question and choice with a space, which belongs to the continuation
        scores = [direct_loglikelihood(model, ids(tokenizer, q["question"]), ids(tokenizer, " " + c))
                  for c in q["choices"]]
        correct.append(float(scores.index(max(scores)) == q["answer"]))
    return correct


def test_run_lm_eval_runs_a_users_task_with_local_data(model, backbone, char_tokenizer, user_tasks, cache):
    summary = run_lm_eval({"backbone": backbone}, ["tiny_choice"], batch_size=4, bootstrap_iters=0)
    correct = choice_correct(model, char_tokenizer, user_tasks)
    assert summary["results"] == {"tiny_choice": {"acc": sum(correct) / len(user_tasks)}}  # no stderr with 0
    assert summary["config"]["corpus"] is None
    assert summary["config"]["bootstrap_iters"] == 0


def test_standard_errors_follow_their_metrics(model, backbone, char_tokenizer, user_tasks, cache, tmp_path,
                                              monkeypatch, capsys):
    """acc's standard error in closed form (the sample standard deviation over √n); perplexity's
    from as many bootstrap resamples as asked, so two counts give two different numbers, each the
    one lm-eval's own bootstrap gives from the per-document log-likelihoods computed here."""
    from lm_eval.api.metrics import bootstrap_stderr, perplexity

    monkeypatch.setenv("DISABLE_MULTIPROC", "1")  # lm-eval's bootstrap in this process, not a pool of cpu_count
    correct = choice_correct(model, char_tokenizer, user_tasks)
    assert 0 < sum(correct) < len(correct), "the test needs a standard error above zero"
    logprobs = [direct_loglikelihood(model, ids(char_tokenizer, c), ids(char_tokenizer, t)) for c, t in NEXT_PAIRS]
    bootstrapped = {iters: bootstrap_stderr(perplexity, logprobs, iters) for iters in (20, 40)}
    capsys.readouterr()  # what lm-eval's bootstrap printed for those
    stderrs = {}
    for iters in (20, 40):
        summary = run_lm_eval({"backbone": backbone}, ["tiny_choice", "tiny_next"], bootstrap_iters=iters,
                              out_dir=tmp_path / str(iters))
        choice, following = summary["results"]["tiny_choice"], summary["results"]["tiny_next"]
        assert list(choice) == ["acc", "acc_stderr"]  # each standard error right after its metric
        assert list(following) == ["perplexity", "perplexity_stderr", "acc", "acc_stderr"]
        assert choice["acc_stderr"] == pytest.approx(statistics.stdev(correct) / math.sqrt(len(correct)), rel=1e-9)
        assert following["perplexity"] == pytest.approx(math.exp(-statistics.fmean(logprobs)), rel=1e-5)
        assert following["perplexity_stderr"] == pytest.approx(bootstrapped[iters], rel=1e-4)
        assert math.isfinite(following["perplexity_stderr"]) and following["perplexity_stderr"] > 0
        assert json.loads((tmp_path / str(iters) / "lm_eval.json").read_text())["results"] == summary["results"]
        stderrs[iters] = following["perplexity_stderr"]
        # the sample logs: one file per task, one line per document, each with its own metric values
        assert summary["config"]["sample_logs"] == {"tiny_choice": "samples_tiny_choice.jsonl",
                                                    "tiny_next": "samples_tiny_next.jsonl"}
        lines = read_jsonl(tmp_path / str(iters) / "samples_tiny_next.jsonl")
        assert [line["perplexity"] for line in lines] == pytest.approx(logprobs, abs=TOL)
        assert [line["doc"] for line in lines] == [{"context": c, "continuation": t} for c, t in NEXT_PAIRS]
        assert [line["arguments"] for line in lines] == [[[c, t]] for c, t in NEXT_PAIRS]
        choices = read_jsonl(tmp_path / str(iters) / "samples_tiny_choice.jsonl")
        assert [line["acc"] for line in choices] == correct
        assert all(list(line)[: len(SAMPLE_FIELDS)] == SAMPLE_FIELDS and len(line["resps"]) == 3 for line in choices)
    assert stderrs[20] != pytest.approx(stderrs[40], rel=1e-6)
    printed = capsys.readouterr()
    assert "bootstrapping for stddev" in printed.err and "bootstrapping" not in printed.out  # stdout stays clean


def test_unknown_task_is_refused_before_the_model_loads(user_tasks):
    with pytest.raises(DihalError, match="unknown lm-eval task.*no-such-task"):
        run_lm_eval("backbone=no-such-backbone", ["tiny_choice", "no-such-task"])


def test_without_lm_eval_the_package_imports_and_explains(monkeypatch, backbone):
    """A fresh copy of the package, imported while `lm_eval` cannot be imported; the loaded one
    is put back afterwards (in sys.modules and as the attribute of dihal_bench)."""
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    for name in [name for name in sys.modules if name.split(".")[:2] == ["dihal_bench", "lm_eval"]]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(dihal_bench, "lm_eval", dihal_bench.lm_eval)
    without = importlib.import_module("dihal_bench.lm_eval")
    assert without.DihalLM is not DihalLM  # a fresh copy, not the loaded package
    assert without.model.lm_eval is None
    with pytest.raises(DihalError, match=re.escape(INSTALL_HINT)):
        without.run_lm_eval("backbone=tiny", ["dihal-local"])
    with pytest.raises(DihalError, match=re.escape(INSTALL_HINT)):
        without.DihalLM(without.load_scorer(backbone))
    assert get_model("dihal") is DihalLM  # the registered class is untouched


# -- sample logs and the command ---------------------------------------------------------------


class Unprintable:
    """A value whose conversion fails, standing for a run killed halfway through a log."""

    def __str__(self):
        raise RuntimeError("killed mid-write")


def test_sample_lines_are_strict_json_converted_deterministically():
    import numpy as np

    sample = {"doc_id": np.int64(3), "doc": {1: "one", None: (1, 2), 2.5: {10, 2, 33}, False: frozenset({"b", "a"})},
              "resps": [[(-1.5, True)]], "nan": float("nan"), "infinities": (float("inf"), -float("inf")),
              "array": np.array([[1, 2]], dtype=np.int32), "tensor": torch.tensor(0.5), "float32": np.float32(0.25),
              "bytes": b"\xffa", "path": Path("a/b"), "flag": np.bool_(True)}
    expected = {"doc_id": 3, "doc": {"1": "one", "null": [1, 2], "2.5": [2, 10, 33], "false": ["a", "b"]},
                "resps": [[[-1.5, True]]], "nan": "NaN", "infinities": ["Infinity", "-Infinity"],
                "array": [[1, 2]], "tensor": 0.5, "float32": 0.25, "bytes": "\\xffa", "path": "a/b", "flag": True}
    converted = json_safe(sample)
    assert converted == expected
    assert type(converted["doc_id"]) is int and type(converted["flag"]) is bool
    line = sample_line(sample)
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert json.loads(line, parse_constant=lambda constant: pytest.fail(f"{constant} in strict JSON")) == expected
    assert list({10, 2, 33}) != [2, 10, 33]  # sets come out sorted, not in their iteration order


def test_sample_log_names_are_safe_and_distinct():
    assert sample_log_name("mmlu_abstract-algebra.v2") == "samples_mmlu_abstract-algebra.v2.jsonl"
    odd = [sample_log_name(name) for name in ("a/b", "a_b", "a b", "../x", "")]
    assert len(set(odd)) == len(odd)
    assert all(re.fullmatch(r"samples_[A-Za-z0-9._-]+\.jsonl", name) and "/" not in name for name in odd)


def test_a_sample_log_cut_short_leaves_the_previous_file_and_no_half_file(tmp_path):
    write_sample_logs({"t": [{"doc_id": 0}]}, tmp_path)
    before = (tmp_path / "samples_t.jsonl").read_bytes()
    with pytest.raises(RuntimeError, match="killed mid-write"):
        write_sample_logs({"t": [{"doc_id": 0}, {"doc_id": 1, "doc": Unprintable()}]}, tmp_path)
    assert (tmp_path / "samples_t.jsonl").read_bytes() == before
    assert [path.name for path in tmp_path.iterdir()] == ["samples_t.jsonl"]  # no temporary file left


def invoke_lm_eval(*args: str):
    from click.testing import CliRunner

    from dihal_bench.cli import cli

    return CliRunner().invoke(cli, ["lm-eval", *args])


def test_the_command_keeps_standard_errors_and_writes_sample_logs(tiny_model_dir, user_tasks, cache, tmp_path):
    model_args = ["--model-args", f"backbone={tiny_model_dir}", "--tasks", "tiny_choice", "--device", "cpu",
                  "--dtype", "float32", "--quiet"]
    result = invoke_lm_eval(*model_args, "--out", str(tmp_path / "on"))
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "on" / "lm_eval.json").read_text())
    assert json.loads(result.stdout) == written["results"]  # printed as written, stderr beside its metric
    assert list(written["results"]["tiny_choice"]) == ["acc", "acc_stderr"]
    stderr = written["results"]["tiny_choice"]["acc_stderr"]
    assert isinstance(stderr, float) and math.isfinite(stderr) and stderr >= 0
    assert written["config"]["bootstrap_iters"] == BOOTSTRAP_ITERS
    lines = read_jsonl(tmp_path / "on" / "samples_tiny_choice.jsonl")
    assert [line["doc"] for line in lines] == user_tasks
    for line in lines:
        assert list(line)[: len(SAMPLE_FIELDS)] == SAMPLE_FIELDS and line["metrics"] == ["acc"]
        assert len(line["arguments"]) == len(line["resps"]) == len(line["filtered_resps"]) == 3  # one per choice
        assert line["acc"] in (0.0, 1.0)
    assert "wrote lm_eval.json and 1 sample log(s) (samples_tiny_choice.jsonl)" in result.stderr

    result = invoke_lm_eval(*model_args, "--out", str(tmp_path / "off"), "--no-log-samples", "--bootstrap-iters", "0")
    assert result.exit_code == 0, result.output
    assert [path.name for path in (tmp_path / "off").iterdir()] == ["lm_eval.json"]
    written = json.loads((tmp_path / "off" / "lm_eval.json").read_text())
    assert list(written["results"]["tiny_choice"]) == ["acc"]
    assert (written["config"]["bootstrap_iters"], written["config"]["sample_logs"]) == (0, {})


def test_the_commands_sample_and_bootstrap_options_are_checked():
    from dihal_bench.cli import lm_eval_cmd

    assert {param.name: param.default for param in lm_eval_cmd.params}["bootstrap_iters"] == BOOTSTRAP_ITERS
    asked = invoke_lm_eval("--model-args", "backbone=smollm2-135m", "--log-samples")
    assert asked.exit_code != 0
    assert "--log-samples writes the sample logs beside lm_eval.json: give --out" in asked.output
    negative = invoke_lm_eval("--model-args", "backbone=smollm2-135m", "--bootstrap-iters", "-1")
    assert negative.exit_code == 2 and "--bootstrap-iters" in negative.output
    with pytest.raises(DihalError, match="bootstrap_iters must be a whole number"):
        run_lm_eval("backbone=smollm2-135m", ["dihal-local"], bootstrap_iters=-5)
