"""The embedded SmolLM2-135M backbone: its dense-weight cache, the cache's integrity guard,
and damaged GGUF input. Builds its own cache in a temporary directory (about 15 s, twice)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from dihal_bench.conformance import check_backbone
from dihal_bench.errors import DihalError
from dihal_builtin.embedded import MANIFEST, cache_root, load_embedded, smollm2_135m

pytestmark = pytest.mark.integration


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
    (directory,) = (cache_dir / "models").iterdir()
    return directory


def probe_ids(backbone) -> torch.Tensor:
    return torch.tensor([backbone.tokenizer("The capital of France is Paris.", add_special_tokens=False)["input_ids"]])


def test_cache_is_built_where_the_environment_says(smollm2, cache_dir):
    assert cache_root() == cache_dir
    directory = model_directory(cache_dir)
    assert directory.name.startswith("smollm2-135m-")
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])


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


def test_smollm2_passes_the_conformance_check(smollm2):
    report = check_backbone(smollm2)
    assert report["passed"]
    assert report["worst_relative"] <= 1e-4
    assert len(report["max_abs_diff"]) == 31


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


def test_corrupt_gguf_is_a_clear_error_naming_the_file(cache_dir, tmp_path):
    gguf = tmp_path / "garbage.gguf"
    gguf.write_bytes(b"this is not a GGUF file " * 16)
    before = sorted(p.name for p in (cache_dir / "models").glob("*"))
    with pytest.raises(DihalError, match=rf"^cannot read GGUF file {re.escape(str(gguf))}: "):
        load_embedded("x", gguf)
    assert sorted(p.name for p in (cache_dir / "models").glob("*")) == before  # no half-built cache left
