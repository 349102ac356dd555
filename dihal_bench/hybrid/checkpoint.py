"""Trained bridge checkpoints: ``model.safetensors`` (weights) + ``bridge.json`` (which bridge
plugin, its constructor options, the layer it replaces, the backbone it was trained on and the
sha256 of the weights, which a load verifies)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import safetensors.torch

from dihal_bench.api.backbone import Backbone
from dihal_bench.base.files import (
    read_safetensors,
    write_bytes_atomic,
    write_json_atomic,
)
from dihal_bench.errors import DihalError
from dihal_bench.registry.resolve import build_bridge

CHECKPOINT_WEIGHTS = "model.safetensors"
CHECKPOINT_META = "bridge.json"


def save_bridge_checkpoint(bridge, name: str, layer: int, backbone_name: str, directory: str | Path) -> Path:
    """Write ``bridge`` to ``directory``: its weights as ``model.safetensors`` and
    ``bridge.json`` = {name (the bridge plugin), config (``bridge.config()``), layer, backbone,
    weights_sha256}.

    The JSON is written last, so a directory that has it holds a complete checkpoint.
    """
    directory = Path(directory)
    # clone: safetensors refuses tensors that share storage
    tensors = {key: value.detach().cpu().clone().contiguous() for key, value in bridge.state_dict().items()}
    weights = safetensors.torch.save(tensors)
    write_bytes_atomic(directory / CHECKPOINT_WEIGHTS, weights)
    write_json_atomic(directory / CHECKPOINT_META,
                      {"name": name, "config": bridge.config(), "layer": int(layer), "backbone": backbone_name,
                       "weights_sha256": hashlib.sha256(weights).hexdigest()})
    return directory


def read_bridge_meta(directory: str | Path, *, trust_unverified: bool = False) -> dict:
    """The checkpoint's ``bridge.json`` (bridge plugin name, config, layer, backbone,
    weights_sha256), every field checked before anything is built from it: a registered bridge
    name, a config of the options that bridge takes (width among them), a layer >= 1, a backbone
    name and the weights' sha256. A checkpoint without its sha256 cannot show that its weights are
    the ones trained: DihalError unless ``trust_unverified`` (``--trust-unverified``)."""
    from dihal_bench.registry.options import check_options, check_registered

    meta_path = Path(directory) / CHECKPOINT_META
    if not meta_path.is_file():
        raise DihalError(f"{directory} is not a bridge checkpoint: {CHECKPOINT_META} is missing")
    check_inside(meta_path, directory)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DihalError(f"{meta_path} is not readable JSON ({str(exc).splitlines()[0]})") from None
    problem = _meta_problem(meta) or _outside_path(meta, Path(directory))
    if problem:
        raise DihalError(f"{meta_path} is not a valid bridge description: {problem}")
    where = f"{meta_path}: config"
    check_registered("bridge", [meta["name"]], f"{meta_path}: name")
    check_options("bridge", meta["name"], meta["config"], where, harness_arguments=0, required=("width",))
    if "weights_sha256" not in meta and not trust_unverified:
        raise DihalError(f"{meta_path} records no weights_sha256, so its weights cannot be verified; "
                         "pass --trust-unverified to load them anyway")
    return meta


def _meta_problem(meta) -> str | None:
    """What makes ``meta`` not a bridge.json object, or None."""
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    for key, kind in (("name", str), ("config", dict), ("layer", int), ("backbone", str)):
        value = meta.get(key)
        if key not in meta:
            return f"{key!r} is missing"
        if isinstance(value, bool) or not isinstance(value, kind) or (kind is str and not value.strip()):
            expected = "a non-empty string" if kind is str else f"a JSON {kind.__name__}"
            return f"{key!r} must be {expected}, got {value!r:.60}"
    if meta["layer"] < 1:
        return f"'layer' must be at least 1, got {meta['layer']}"
    digest = meta.get("weights_sha256")
    if "weights_sha256" in meta and not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
        return f"'weights_sha256' must be 64 lowercase hex digits, got {digest!r:.80}"
    return None


_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_inside(path: Path, directory: str | Path) -> None:
    """DihalError unless ``path``, its symlinks followed, is inside the checkpoint ``directory``:
    a checkpoint is one folder, and a link out of it would read whatever file it names."""
    folder = Path(directory).resolve()
    target = Path(path).resolve()
    if not target.is_relative_to(folder):
        raise DihalError(f"{path} leads outside the bridge checkpoint {directory} (to {target}); refused: a "
                         "checkpoint's files must be inside its folder (copy them in instead of linking)")


def _outside_path(meta: dict, directory: Path) -> str | None:
    """A top-level field of bridge.json that names a path leading outside ``directory``, if any:
    the format names no file (the weights are always model.safetensors beside it), so such a
    field is a crafted or foreign one, and nothing may be read through it. ``backbone`` is left
    out: it names the model trained on (a local model folder is a path), compared, never read."""
    for key, value in meta.items():
        if key != "backbone" and isinstance(value, str) and ("/" in value or "\\" in value or value.startswith("~")):
            named = (directory / Path(value).expanduser()).resolve()
            if not named.is_relative_to(directory.resolve()):
                return f"{key!r} names the path {value!r:.80}, outside the checkpoint's folder"
    return None


def load_bridge_checkpoint(directory: str | Path, backbone: Backbone, *, layer: int | None = None,
                           trust_unverified: bool = False):
    """``(bridge, layer)`` from a `save_bridge_checkpoint` directory, the bridge in eval mode on
    the backbone's device.

    DihalError when the checkpoint was trained on another backbone, its width differs from
    the backbone's, its layer is out of range or differs from ``layer`` (when given), the
    weights are damaged (truncated, or not the bytes bridge.json's sha256 describes), bridge.json
    records no sha256 and ``trust_unverified`` is not given, or the weights do not fit the
    architecture its config describes.
    """

    directory = Path(directory)
    meta = read_bridge_meta(directory, trust_unverified=trust_unverified)
    name, config, saved_layer, trained_on = meta["name"], meta["config"], meta["layer"], meta["backbone"]
    if trained_on != backbone.name:
        raise DihalError(f"bridge checkpoint {directory} was trained on backbone {trained_on!r}, not {backbone.name!r}")
    if layer is not None and int(layer) != saved_layer:
        raise DihalError(f"bridge checkpoint {directory} replaces layers 1..{saved_layer}, not 1..{layer}")
    backbone.check_layer(saved_layer)
    bridge = build_bridge(name, **config)
    if bridge.width != backbone.width:
        raise DihalError(f"bridge checkpoint {directory} has width {bridge.width}, "
                         f"backbone {backbone.name} has {backbone.width}")
    weights = directory / CHECKPOINT_WEIGHTS
    if not weights.is_file():
        raise DihalError(f"bridge checkpoint {directory} has no {CHECKPOINT_WEIGHTS}")
    check_inside(weights, directory)
    # without a recorded sha256 (only with trust_unverified) the weights are read unverified
    tensors = read_safetensors(weights, meta.get("weights_sha256"), recorded_in=directory / CHECKPOINT_META)
    try:
        bridge.load_state_dict(tensors)
    except RuntimeError as exc:
        raise DihalError(f"bridge weights in {weights} do not fit bridge {name!r}: "
                         f"{str(exc).splitlines()[0]}") from None
    return bridge.to(backbone.device).eval(), saved_layer
