"""The `paper` suite's scorer, GPT-2 Large (the field's Gen.PPL convention), on a stand-in.

Every other test scores with a Llama-type or char-tokenizer model, whose layout the backbone
class can enter; GPT-2's cannot (``transformer.{wte, wpe, h, ln_f}``, learned positions), and
its tokenizer has one special token, ``<|endoftext|>``, as BOS and EOS and no pad. Here a tiny
random GPT-2 with a byte-level BPE tokenizer, both built in-process and saved as a local
directory, stands in for ``openai-community/gpt2-large``: nothing is downloaded.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from dihal_builtin.hf_backbone import HFBackbone, HFEvaluator
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

from dihal_bench.api.metrics import MetricContext, SampleSet, evaluate_texts, evaluator_features
from dihal_bench.config.suite import apply_overrides, check_scorer, resolve_suite
from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import get_registry
from dihal_bench.study.preflight import check_backbone_name
from dihal_bench.study.run import Run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ENDOFTEXT = "<|endoftext|>"
#: the stand-in's position table: small, so that the tests can run a text past it
N_POSITIONS = 24
#: GPT-2 Large's position table (its published config.json, n_positions), which the paper
#: suite's metrics.max_length must not exceed
GPT2_LARGE_POSITIONS = 1024
WORDS = "the cat sat on a mat while dogs ran through parks and birds sang over tall green trees".split()
#: lengths differ, so corpus-level and per-sample Gen.PPL weigh the samples differently; one
#: sample is degenerate (one word is most of it), so the known answer must leave it out; one word
#: ("zebra") is outside the BPE's training text, so it falls back to byte tokens
TEXTS = [
    "the cat sat on a mat",
    "dogs ran through parks while birds sang over tall green trees and the cat sat",
    "a zebra sat on the mat",
    "the the the cat",
    "birds sang",
]
DEGENERATE = 3
#: float32 logits: one token's log-softmax is off by a few float32 ulps of the logits' scale, and
#: a padded batch against one unpadded sequence rounds its attention differently by about as
#: much, ~1e-6 of a token's NLL at most; the sums are float64, so the error does not grow with
#: length. 1e-5 leaves a tenfold margin
RELATIVE_NLL = 1e-5


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> str:
    """A tiny random GPT-2 and a GPT-2-style tokenizer saved with ``save_pretrained``."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # the 256 byte symbols first, as GPT-2's vocabulary has them, so that any text encodes
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=[ENDOFTEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator([" ".join(WORDS)] * 4, trainer)
    tokenizer = GPT2TokenizerFast(tokenizer_object=backend, bos_token=ENDOFTEXT, eos_token=ENDOFTEXT,
                                  unk_token=ENDOFTEXT)
    special = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    # initializer_range 0.2 (GPT-2's is 0.02): logits of O(1) spread, so that a token scored
    # against the wrong position or without BOS moves the NLL by far more than the tolerance
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=N_POSITIONS, n_embd=32, n_layer=2, n_head=2,
                        initializer_range=0.2, bos_token_id=special, eos_token_id=special)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config).eval()
    directory = tmp_path_factory.mktemp("gpt2-stand-in")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def plain(gpt2_dir):
    """The stand-in as plain transformers loads it: the known answers' model and tokenizer."""
    return GPT2LMHeadModel.from_pretrained(gpt2_dir).eval(), AutoTokenizer.from_pretrained(gpt2_dir)


def paper_suite(**overrides: str):
    """The paper suite, on this machine's CPU in float32 (float32 logits are what the
    tolerances assume), with ``overrides`` (values as JSON)."""
    _, config = resolve_suite("paper")
    return apply_overrides(config, {"device": '"cpu"', "dtype": '"float32"', "device_map": '""', **overrides})


@pytest.fixture(scope="module")
def evaluator(gpt2_dir, tmp_path_factory):
    """The stand-in loaded as the paper suite's evaluator, by the run that a suite run builds."""
    run = Run("paper", paper_suite(evaluator=json.dumps(gpt2_dir)), tmp_path_factory.mktemp("runs"),
              progress=False)
    loaded = run.evaluator
    # the names differ, so the evaluator is loaded on its own: the 8B backbone is never touched
    assert "backbone" not in vars(run)
    return loaded


def known_nll(plain, text: str) -> tuple[float, int]:
    """(summed NLL in nats, scored tokens) of ``text`` by hand: [<|endoftext|>] + its ids, one
    unpadded sequence, every text token scored against the position before it."""
    model, tokenizer = plain
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    sequence = torch.tensor([[tokenizer.convert_tokens_to_ids(ENDOFTEXT)] + ids])
    with torch.no_grad():
        logits = model(sequence).logits[0, :-1]
    log_probs = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids)), torch.tensor(ids)]
    return -float(log_probs.double().sum()), len(ids)


def test_the_stand_in_is_gpt2_shaped(gpt2_dir, plain, evaluator):
    model, tokenizer = plain
    assert model.config.model_type == "gpt2" and not hasattr(model, "model")  # no Llama-style layout
    special = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    assert tokenizer.bos_token_id == tokenizer.eos_token_id == special and tokenizer.pad_token_id is None
    # a backbone must be enterable midway, GPT-2 cannot be; an evaluator is read whole
    assert isinstance(evaluator, HFEvaluator) and not isinstance(evaluator, HFBackbone)
    assert evaluator.tokenizer.bos_token_id == special and evaluator.context_length == N_POSITIONS


def test_gen_ppl_under_gpt2_follows_the_documented_convention(plain, evaluator):
    samples = SampleSet("stand-in", TEXTS, [[0]] * len(TEXTS))
    ctx = MetricContext(evaluator=evaluator, references=[], seed=0, min_valid=1)
    metrics = get_registry().items["metric"]
    result = metrics["gen_ppl"].obj(samples, ctx)
    sample_mean = metrics["gen_ppl_sample_mean"].obj(samples, ctx)

    known = [known_nll(plain, text) for text in TEXTS]
    valid = [i for i in range(len(TEXTS)) if i != DEGENERATE]
    assert (result["n_valid"], result["n_invalid"]) == (len(valid), 1)
    # every text token scored, the first against <|endoftext|>: as many as the text has ids
    assert result["tokens_per_sample"] == [count for _, count in known]
    assert result["tokens"] == sum(known[i][1] for i in valid)
    assert result["nll_per_sample"][DEGENERATE] is None
    for i in valid:
        assert result["nll_per_sample"][i] == pytest.approx(known[i][0], rel=RELATIVE_NLL)

    # corpus level: exp(Σ NLL / Σ tokens). On the log scale the bound is the NLL's own
    mean_nll = sum(known[i][0] for i in valid) / sum(known[i][1] for i in valid)
    assert math.log(result["gen_ppl"]) == pytest.approx(mean_nll, rel=RELATIVE_NLL)
    # per sample: (1/m) Σ exp(NLL_i / n_i). Each term is off by at most RELATIVE_NLL × its log, so
    # their mean by at most that share of the largest log
    per_token = [known[i][0] / known[i][1] for i in valid]
    expected = sum(math.exp(x) for x in per_token) / len(per_token)
    assert sample_mean["gen_ppl_sample_mean"] == pytest.approx(expected, rel=RELATIVE_NLL * max(per_token))
    # the lengths differ, so the two conventions part: the test tells them apart
    assert abs(math.log(expected) - mean_nll) > 100 * RELATIVE_NLL * max(per_token)


def test_mauve_features_under_gpt2_are_the_final_layer_norms_output(plain, evaluator):
    # a generation's feature comes from the scoring pass, a reference's from a pass of its own:
    # both must be GPT-2's state after ln_f at the text's last token, or MAUVE compares unlike things
    model, tokenizer = plain
    texts = TEXTS[:3]
    scored = evaluate_texts(evaluator, texts).features
    referenced = evaluator_features(evaluator, texts)
    for row, text in enumerate(texts):
        sequence = torch.tensor([[tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            expected = model.transformer(sequence).last_hidden_state[0, -1].numpy()
        # float32 states of O(1) after a layer norm: a few ulps, padded or not
        assert scored[row] == pytest.approx(expected, rel=1e-5, abs=1e-5)
        assert referenced[row] == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_the_position_table_bounds_what_is_scored(plain, evaluator):
    long_text = " ".join(WORDS * 3)
    _, tokenizer = plain
    assert len(tokenizer(long_text, add_special_tokens=False)["input_ids"]) > N_POSITIONS
    samples = SampleSet("stand-in", [long_text], [[0]])
    gen_ppl = get_registry().items["metric"]["gen_ppl"].obj
    # max_length counts BOS, so at the table's size the text keeps N_POSITIONS - 1 tokens, all scored
    fits = gen_ppl(samples, MetricContext(evaluator=evaluator, references=[], seed=0, min_valid=1,
                                          max_length=N_POSITIONS))
    assert fits["tokens_per_sample"] == [N_POSITIONS - 1] and fits["gen_ppl"] is not None
    # past it, one line that names the setting, not an index error inside torch (on a GPU, a
    # device-side assert that ends the process)
    with pytest.raises(DihalError, match=rf"^evaluator .*: an input of {N_POSITIONS + 1} tokens, but it takes at "
                                         rf"most {N_POSITIONS}; set metrics\.max_length to {N_POSITIONS} or less$"):
        gen_ppl(samples, MetricContext(evaluator=evaluator, references=[], seed=0, min_valid=1,
                                       max_length=N_POSITIONS + 1))
    # the paper suite scores within GPT-2 Large's table
    assert resolve_suite("paper")[1].metrics.max_length <= GPT2_LARGE_POSITIONS


def test_the_paper_suite_accepts_a_local_gpt2_scorer_and_refuses_its_own_backbone(gpt2_dir):
    suite = paper_suite(evaluator=json.dumps(gpt2_dir))
    assert suite.evaluator != suite.backbone and not suite.evaluator_is_backbone
    check_scorer(suite, "suite paper")
    check_backbone_name(suite.evaluator, "evaluator")  # a local directory is a model name
    own = paper_suite(evaluator=json.dumps(suite.backbone))
    with pytest.raises(DihalError) as refused:
        check_scorer(own, "suite paper")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("suite paper: the evaluator is the backbone "
                                                      "(meta-llama/Llama-3.1-8B-Instruct)")
    assert "evaluator_is_backbone = true" in message
