"""Trained bridge checkpoints: ``model.safetensors`` (weights) + ``bridge.json`` (which bridge
plugin, its constructor options, the layer it replaces and the backbone it was trained on)."""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch

from dihal_bench.backbone import Backbone
from dihal_bench.errors import DihalError
from dihal_bench.records import write_bytes_atomic, write_json_atomic

CHECKPOINT_WEIGHTS = "model.safetensors"
CHECKPOINT_META = "bridge.json"


def save_bridge_checkpoint(bridge, name: str, layer: int, backbone_name: str, directory: str | Path) -> Path:
    """Write ``bridge`` to ``directory``: its weights as ``model.safetensors`` and
    ``bridge.json`` = {name (the bridge plugin), config (``bridge.config()``), layer, backbone}.

    The JSON is written last, so a directory that has it holds a complete checkpoint.
    """
    directory = Path(directory)
    # clone: safetensors refuses tensors that share storage
    tensors = {key: value.detach().cpu().clone().contiguous() for key, value in bridge.state_dict().items()}
    write_bytes_atomic(directory / CHECKPOINT_WEIGHTS, safetensors.torch.save(tensors))
    write_json_atomic(directory / CHECKPOINT_META,
                      {"name": name, "config": bridge.config(), "layer": int(layer), "backbone": backbone_name})
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
    the backbone's, its layer is out of range or differs from ``layer`` (when given), or the
    weights do not fit the architecture its config describes.
    """
    from dihal_bench.plugins import get_registry

    directory = Path(directory)
    meta = read_bridge_meta(directory)
    name, config, saved_layer, trained_on = meta["name"], meta["config"], meta["layer"], meta["backbone"]
    if trained_on != backbone.name:
        raise DihalError(f"bridge checkpoint {directory} was trained on backbone {trained_on!r}, not {backbone.name!r}")
    if layer is not None and int(layer) != saved_layer:
        raise DihalError(f"bridge checkpoint {directory} replaces layers 1..{saved_layer}, not 1..{layer}")
    backbone.check_layer(saved_layer)
    bridge = get_registry().get("bridge", name).obj(**config)
    if bridge.width != backbone.width:
        raise DihalError(f"bridge checkpoint {directory} has width {bridge.width}, backbone {backbone.name} has {backbone.width}")
    weights = directory / CHECKPOINT_WEIGHTS
    if not weights.is_file():
        raise DihalError(f"bridge checkpoint {directory} has no {CHECKPOINT_WEIGHTS}")
    try:
        bridge.load_state_dict(safetensors.torch.load_file(weights))
    except RuntimeError as exc:
        raise DihalError(f"bridge weights in {weights} do not fit bridge {name!r}: {str(exc).splitlines()[0]}") from None
    return bridge.to(backbone.device).eval(), saved_layer
