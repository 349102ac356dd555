"""Trained bridge checkpoints: ``model.safetensors`` (weights) + ``bridge.json`` (which bridge
plugin, its constructor options, the layer it replaces, the backbone it was trained on and the
sha256 of the weights, which a load verifies)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import safetensors.torch

from dihal_bench.backbone import Backbone
from dihal_bench.bridge import build_bridge
from dihal_bench.errors import DihalError
from dihal_bench.records import read_safetensors, write_bytes_atomic, write_json_atomic

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


def read_bridge_meta(directory: str | Path) -> dict:
    """The checkpoint's ``bridge.json``: bridge plugin name, config, layer and backbone."""
    meta_path = Path(directory) / CHECKPOINT_META
    if not meta_path.is_file():
        raise DihalError(f"{directory} is not a bridge checkpoint: {CHECKPOINT_META} is missing")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        meta["layer"] = int(meta["layer"])
        for key in ("name", "config", "backbone"):
            if key not in meta:
                raise KeyError(key)
    except (ValueError, KeyError, TypeError) as exc:
        raise DihalError(f"{meta_path} is not a valid bridge description: {exc!r}") from None
    return meta


def load_bridge_checkpoint(directory: str | Path, backbone: Backbone, *, layer: int | None = None):
    """``(bridge, layer)`` from a `save_bridge_checkpoint` directory, the bridge in eval mode on
    the backbone's device.

    DihalError when the checkpoint was trained on another backbone, its width differs from
    the backbone's, its layer is out of range or differs from ``layer`` (when given), the
    weights are damaged (truncated, or not the bytes bridge.json's sha256 describes) or they
    do not fit the architecture its config describes.
    """

    directory = Path(directory)
    meta = read_bridge_meta(directory)
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
    # checkpoints written before bridge.json held a sha256 are still read, unverified
    tensors = read_safetensors(weights, meta.get("weights_sha256"), recorded_in=directory / CHECKPOINT_META)
    try:
        bridge.load_state_dict(tensors)
    except RuntimeError as exc:
        raise DihalError(f"bridge weights in {weights} do not fit bridge {name!r}: "
                         f"{str(exc).splitlines()[0]}") from None
    return bridge.to(backbone.device).eval(), saved_layer
