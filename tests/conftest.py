"""Shared fixtures: a character-level tokenizer, tiny random-weight decoder LMs and backbones,
short sentence corpora, torch on one thread, and inline plugins.

Everything is built in-process from code and fixed seeds: no download, no file outside tmp.
"""

from __future__ import annotations

import copy
import importlib.metadata
import random
import string
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from dihal_builtin import compat
from dihal_builtin.hf_backbone import HFBackbone
from packaging.requirements import Requirement
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import (
    get_registry,
    register_plugin,
    unregister_plugin,
)

#: the direct dependencies whose installed versions the report header names (CI runs both ends of their ranges)
HEADER_PACKAGES = ("torch", "transformers", "peft", "datasets", "numpy", "pandas", "gguf")


def declared_requirement(name: str) -> Requirement:
    """dihal-bench's declared requirement on ``name``, as installed (pyproject.toml's line)."""
    for line in importlib.metadata.requires("dihal-bench") or ():
        requirement = Requirement(line)
        if requirement.name == name and not requirement.marker:
            return requirement
    raise LookupError(f"dihal-bench declares no requirement on {name}")


def pytest_report_header(config):
    """The versions this run tested, each beside its declared range, and which names the
    installed transformers uses (plugins/dihal_builtin/compat.py), at the top of the output."""
    versions = ", ".join(f"{name} {importlib.metadata.version(name)} ({declared_requirement(name).specifier})"
                         for name in HEADER_PACKAGES)
    return [f"dihal-bench tested with: {versions}", f"transformers names: {compat.describe()}"]


#: the tiny models' vocabulary; the tokenizer uses ids 0..102 of it
TINY_VOCAB = 128
#: Gemma3's local attention width: the tests' sequences are longer than this
TINY_SLIDING_WINDOW = 8
#: the vocabulary of the seeded word-salad corpora
WORDS = "the of and a to in is was that for on are with as by at from this be or an which not".split()
#: SmolLM2-135M's vocabulary size, which dominates what the baselines' allowance sizing counts
SMOLLM2_VOCAB = 49_152


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one thread for a whole test module, restored afterwards.

    Tiny models gain nothing from threads, and on a shared 2-core machine the thread pool's
    waiting makes each small op slow by orders of magnitude. Module scope, so that it also
    covers module-scoped fixtures that train: a module takes it with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``, and a module-scoped fixture
    that trains names it as an argument.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character: <pad>=0, <eos>=1, <unk>=2, then the 100 characters of
    ``string.printable`` as 3..102. Adds no special tokens, so a text of n characters is
    exactly n tokens."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(string.printable)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # [\s\S] and not ".": the regex engine's "." skips newlines
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def _config_kwargs(layers: int) -> dict:
    # initializer_range 0.2 (not the default 0.02) so that every layer changes the
    # logits by O(1): a resume from the wrong layer is then off by a lot, not by 1e-4.
    return dict(
        vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        initializer_range=0.2, pad_token_id=0, eos_token_id=1, bos_token_id=None,
    )


def _tiny_llama() -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(**_config_kwargs(layers=3)))


def _tiny_qwen3() -> Qwen3ForCausalLM:
    return Qwen3ForCausalLM(Qwen3Config(**_config_kwargs(layers=4)))


def _tiny_gemma3() -> Gemma3ForCausalLM:
    # Local and global layers mixed so that a resume can start at either kind; a logit
    # softcap the logits actually reach, so the backbone's own head must apply it.
    config = Gemma3TextConfig(
        **_config_kwargs(layers=4),
        sliding_window=TINY_SLIDING_WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        final_logit_softcapping=3.0,
    )
    return Gemma3ForCausalLM(config)


TINY_BUILDERS = {"llama": _tiny_llama, "qwen3": _tiny_qwen3, "gemma3": _tiny_gemma3}


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, torch.nn.Module]:
    """One random-weight causal LM per family (float32, eval mode), seeded: family -> model.

    Shared by the whole session: tests must not change them (copy first).
    """
    built = {}
    for seed, (family, build) in enumerate(TINY_BUILDERS.items()):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            built[family] = build().eval()
    return built


@pytest.fixture(scope="module")
def llama_backbone(tiny_models, char_tokenizer) -> HFBackbone:
    """The tiny Llama with the character tokenizer as an HFBackbone; each test module gets a
    copy of the model of its own."""
    return HFBackbone(copy.deepcopy(tiny_models["llama"]), char_tokenizer, "tiny-llama")


@pytest.fixture(scope="module")
def smollm2_sized_backbone(char_tokenizer) -> HFBackbone:
    """A one-layer random Llama with SmolLM2's vocabulary size: what the allowance sizing sees."""
    config = LlamaConfig(vocab_size=SMOLLM2_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0, eos_token_id=1)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return HFBackbone(LlamaForCausalLM(config), char_tokenizer, "smollm2-sized")


@pytest.fixture(scope="session")
def encode_sentences(char_tokenizer) -> Callable[[list[str], int], torch.Tensor]:
    """``encode_sentences(sentences, copies)``: the character tokens of equally long sentences,
    the list repeated ``copies`` times, as (copies·len(sentences), length) token ids whose rows
    cycle through the sentences."""

    def encode(sentences: list[str], copies: int) -> torch.Tensor:
        rows = char_tokenizer(sentences, add_special_tokens=False)["input_ids"]
        assert len({len(row) for row in rows}) == 1, f"sentences of different lengths: {sentences}"
        return torch.tensor(rows).repeat(copies, 1)

    return encode


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_models, char_tokenizer, tmp_path_factory) -> str:
    """The tiny Gemma3 and the character tokenizer saved with ``save_pretrained``: a local
    model directory that ``HFBackbone.from_pretrained`` and ``load_backbone`` accept."""
    directory = tmp_path_factory.mktemp("tiny-gemma3")
    tiny_models["gemma3"].save_pretrained(directory)
    char_tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture
def inline_plugin():
    """``inline_plugin(plugin, name)`` registers a plugin object for one test only.

    Unregistered afterwards even when the registration itself raised (``register_plugin``
    rebuilds the process-wide registry, which may fail on purpose in a test).
    """
    names = []

    def register(plugin: object, name: str) -> None:
        names.append(name)
        register_plugin(plugin, name)

    try:
        yield register
    finally:
        for name in names:
            try:
                unregister_plugin(name)
            except DihalError:  # it still conflicts with a plugin not yet unregistered
                pass
        get_registry(refresh=True)


@pytest.fixture(scope="session")
def text_dir(tmp_path_factory) -> Path:
    """Sixty seeded word-salad documents of ~400 characters (= tokens for the char tokenizer)."""
    directory = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for i in range(60):
        (directory / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(100)))
    return directory


@pytest.fixture(scope="session")
def tiny_suite_file(tmp_path_factory, tiny_model_dir) -> Path:
    """A whole suite (every stage, every method kind) on a tiny random-weight model and an 80-document
    word-salad corpus: seconds per stage."""
    root = tmp_path_factory.mktemp("suite")
    corpus = root / "corpus"
    corpus.mkdir()
    rng = random.Random(1)
    for i in range(80):
        (corpus / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(60)))
    suite = root / "tiny.toml"
    suite.write_text(f'''
description = "tiny end-to-end suite for tests"
backbone = "{tiny_model_dir}"
corpus = "{corpus}"
evaluator = "{tiny_model_dir}"
evaluator_is_backbone = true
seeds = [0]
[locate]
tokens = 200
seq_len = 32
proxies = ["global_monotonicity", "effective_rank"]
[sweep]
layers = "auto"
count = 3
eval_sequences = 4
budget = {{ steps = 4, batch_size = 4, seq_len = 16 }}
[budget]
steps = 6
batch_size = 4
seq_len = 16
[bridge]
options = {{ d_model = 32, layers = 1, heads = 2 }}
sample_steps = 2
steps_axis = [1, 2]
[methods]
dihal = ["chosen", "worst", "oracle"]
controls = ["skip", "regressor"]
references = ["unigram", "human"]
baselines = ["ar-backbone"]
[sampling]
samples = 4
seq_len = 8
batch_size = 2
[metrics]
names = ["gen_ppl", "gen_ppl_sample_mean", "entropy", "diversity"]
mauve = false
min_valid = 1
latency_repeats = 1
test_nll_windows = 4
''')
    return suite
