"""The embedded backbones' dense-weight cache: a standard checkpoint, guarded by its own
checks only (a bad device or dtype leaves it alone), built by one process at a time. First on
a tiny tied-embedding model standing in for a GGUF file; then (integration) on the real
SmolLM2-135M, whose cache is built in a temporary directory (about 15 s, twice)."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import dihal_builtin.embedded as embedded
import pytest
import torch
from dihal_builtin.embedded import MANIFEST, load_embedded, smollm2_135m
from dihal_builtin.hf_backbone import HFBackbone
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from dihal_bench.api.conformance import check_backbone
from dihal_bench.base.cache import cache_root
from dihal_bench.errors import DihalError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- the cache, on a tiny model standing in for a GGUF file ------------------------------------


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch, char_tokenizer):
    """(a stand-in GGUF file, the model its reader returns, the list of reads): the cache lives
    in ``tmp_path/cache``, and reading the "GGUF" gives a tiny Llama with tied input and
    output embeddings, as SmolLM2's and Gemma-3's are."""
    monkeypatch.setenv("DIHAL_BENCH_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"stands in for a GGUF file")
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.2,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    reads = []

    def read(path):
        reads.append(path)
        time.sleep(0.5)  # long enough for a second loader to find the build under way
        return HFBackbone(model, char_tokenizer, path.stem)

    monkeypatch.setattr(embedded, "_read_gguf", read)
    return gguf, model, reads


def cache_folder(cache: Path) -> Path:
    """The one model folder in the cache (besides the hidden lock file of its build)."""
    (directory,) = [path for path in (cache / "models").iterdir() if not path.name.startswith(".")]
    return directory


def assert_same_tensors(loaded: torch.nn.Module, reference: torch.nn.Module):
    expected = reference.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, expected[key]), key


def test_the_cache_is_a_standard_checkpoint_that_automodel_loads_exactly(tiny_gguf, tmp_path):
    gguf, model, _ = tiny_gguf
    backbone = load_embedded("tiny", gguf)
    assert_same_tensors(backbone.model, model)
    directory = cache_folder(tmp_path / "cache")
    # the tied table is stored once, under the input embedding's name (as save_pretrained does)
    stored = load_file(directory / "model.safetensors")
    assert "model.embed_tokens.weight" in stored and "lm_head.weight" not in stored

    for auto, reference in ((AutoModel, model.model), (AutoModelForCausalLM, model)):
        loaded, info = auto.from_pretrained(directory, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], (auto.__name__, info)
        assert_same_tensors(loaded, reference)


def test_a_bad_dtype_or_device_leaves_the_cache_alone(tiny_gguf, tmp_path):
    gguf, _, reads = tiny_gguf
    load_embedded("tiny", gguf)
    directory = cache_folder(tmp_path / "cache")
    before = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in directory.iterdir()}

    with pytest.raises(DihalError, match="unknown dtype 'float64'"):
        load_embedded("tiny", gguf, dtype="float64")
    with pytest.raises(DihalError, match="unknown device 'gpu'"):
        load_embedded("tiny", gguf, device="gpu")
    # a well-formed device this machine does not have: the failure comes from moving the model
    missing = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(DihalError, match=rf"cannot load tiny on device '{missing}'"):
        load_embedded("tiny", gguf, device=missing)

    assert len(reads) == 1
    assert {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in directory.iterdir()} == before


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def drop_the_format(path: Path) -> None:
    """The manifest of a cache written before format v2 (tied weights under lm_head)."""
    manifest = json.loads(path.read_text())
    del manifest["format"]
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("file, damage", [
    ("model.safetensors", flip_last_byte),
    ("config.json", lambda path: path.unlink()),
    (MANIFEST, drop_the_format),
])
def test_a_cache_that_fails_its_own_checks_is_rebuilt(tiny_gguf, tmp_path, file, damage):
    gguf, model, reads = tiny_gguf
    load_embedded("tiny", gguf)
    damage(cache_folder(tmp_path / "cache") / file)
    rebuilt = load_embedded("tiny", gguf)
    assert len(reads) == 2
    assert_same_tensors(rebuilt.model, model)
    assert load_embedded("tiny", gguf) is not None and len(reads) == 2


def test_concurrent_loads_build_the_cache_once(tiny_gguf, tmp_path, capsys, monkeypatch):
    """Two threads stand in for two processes: each takes the build lock through a file
    descriptor of its own, and flock excludes descriptors, not processes."""
    gguf, model, reads = tiny_gguf
    start, loaded, failures = threading.Barrier(2), [], []
    serial, load_dense = threading.Lock(), HFBackbone.from_pretrained

    def one_at_a_time(*args, **kwargs):
        with serial:  # transformers' loading is not thread-safe; the cache build under test is not serialised
            return load_dense(*args, **kwargs)

    monkeypatch.setattr(HFBackbone, "from_pretrained", one_at_a_time)

    def load():
        start.wait()
        try:
            loaded.append(load_embedded("tiny", gguf))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures and len(loaded) == 2
    assert len(reads) == 1  # the second loader waited for the first build and then used it
    assert "waiting for another process to finish dequantising tiny" in capsys.readouterr().err
    for backbone in loaded:
        assert_same_tensors(backbone.model, model)
    directory = cache_folder(tmp_path / "cache")
    assert sorted(p.name for p in directory.parent.iterdir()) == [f".{directory.name}.lock", directory.name]


# -- the real SmolLM2-135M (integration) -------------------------------------------------------


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """``DIHAL_BENCH_CACHE`` for this module: a fresh, empty directory."""
    directory = tmp_path_factory.mktemp("dihal-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIHAL_BENCH_CACHE", str(directory))
        yield directory


@pytest.fixture(scope="module")
def smollm2(cache_dir):
    """SmolLM2-135M, loaded once through a cache this fixture builds."""
    assert not (cache_dir / "models").exists()
    return smollm2_135m()


def model_directory(cache_dir: Path) -> Path:
    return cache_folder(cache_dir)


def probe_ids(backbone) -> torch.Tensor:
    return torch.tensor([backbone.tokenizer("The capital of France is Paris.", add_special_tokens=False)["input_ids"]])


@pytest.mark.integration
def test_cache_is_built_where_the_environment_says(smollm2, cache_dir):
    assert cache_root() == cache_dir
    directory = model_directory(cache_dir)
    assert directory.name.startswith("smollm2-135m-")
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])


@pytest.mark.integration
def test_smollm2_shape_and_tokenizer(smollm2):
    assert smollm2.describe() == {
        "name": "smollm2-135m", "layers": 30, "width": 576, "vocab": 49152,
        "parameters": 134_515_008, "dtype": "float32", "device": "cpu",
    }
    assert smollm2.sliding_window is None
    tokenizer = smollm2.tokenizer
    # The tokenizer defines a BOS token but does not add it; no EOS either.
    text = "Hello world"
    assert tokenizer(text)["input_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.bos_token_id not in tokenizer(text)["input_ids"]
    assert tokenizer.pad_token_id is not None


@pytest.mark.integration
def test_smollm2_passes_the_conformance_check(smollm2):
    report = check_backbone(smollm2)
    assert report["passed"]
    assert report["worst_relative"] <= 1e-4
    assert len(report["max_abs_diff"]) == 31


@pytest.mark.integration
def test_truncated_cache_is_detected_and_rebuilt(smollm2, cache_dir):
    weights = model_directory(cache_dir) / "model.safetensors"
    size = weights.stat().st_size
    # Swap in a truncated copy rather than truncating in place: the loaded `smollm2` maps
    # the file's pages, and truncating them would crash it with SIGBUS.
    damaged = weights.with_suffix(".damaged")
    with weights.open("rb") as source, damaged.open("wb") as target:
        target.write(source.read(size // 2))
    damaged.replace(weights)
    rebuilt = smollm2_135m()
    assert weights.stat().st_size == size
    ids = probe_ids(smollm2)
    assert torch.equal(rebuilt.logits(ids), smollm2.logits(ids))


@pytest.mark.integration
def test_corrupt_gguf_is_a_clear_error_naming_the_file(cache_dir, tmp_path):
    gguf = tmp_path / "garbage.gguf"
    gguf.write_bytes(b"this is not a GGUF file " * 16)
    def visible_entries():  # hidden ones are the (empty) lock files of this and earlier loads
        return sorted(p.name for p in (cache_dir / "models").glob("*") if not p.name.startswith("."))

    before = visible_entries()
    with pytest.raises(DihalError, match=rf"^cannot read GGUF file {re.escape(str(gguf))}: "):
        load_embedded("x", gguf)
    assert visible_entries() == before  # no half-built cache left behind


@pytest.mark.integration
def test_the_dequantised_folder_loads_exactly_with_automodel(smollm2, cache_dir):
    directory = model_directory(cache_dir)
    for auto, reference in ((AutoModel, smollm2.model.model), (AutoModelForCausalLM, smollm2.model)):
        loaded, info = auto.from_pretrained(directory, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], (auto.__name__, info)
        assert_same_tensors(loaded, reference)
        del loaded


def test_shape_and_tokenizer_come_from_a_verified_cache_without_the_weights(tiny_gguf, tmp_path, char_tokenizer):
    """The pre-flight hooks read the cache's config and tokenizer (never its weights) once its
    manifest vouches for them, and otherwise the GGUF file's metadata: a stand-in file that is
    no GGUF is then refused, naming it."""
    gguf, _, _ = tiny_gguf
    with pytest.raises(DihalError, match="cannot read GGUF file .*tiny.gguf"):
        embedded.describe_embedded("tiny", gguf)  # no cache yet
    load_embedded("tiny", gguf)
    directory = cache_folder(tmp_path / "cache")
    (directory / "model.safetensors").unlink()
    assert embedded.describe_embedded("tiny", gguf) == {"layers": 2, "width": 32, "vocab": 128}
    text = "x = [1, 2]\n"
    assert embedded.embedded_tokenizer("tiny", gguf)(text)["input_ids"] == char_tokenizer(text)["input_ids"]
    flip_last_byte(directory / "config.json")  # no longer what the manifest recorded
    with pytest.raises(DihalError, match="cannot read GGUF file"):
        embedded.describe_embedded("tiny", gguf)
