"""Built-in backbones: the two embedded GGUF models and any Hugging Face causal LM."""

from pathlib import Path

from dihal_bench import hookimpl

from .embedded import gemma3_270m, smollm2_135m
from .hf_backbone import HFBackbone


def handles_hf(reference: str) -> bool:
    """A local model directory, or a Hugging Face hub id ``org/name``."""
    if Path(reference).is_dir():
        return True
    parts = reference.split("/")
    return len(parts) == 2 and all(parts) and not reference.startswith((".", "/"))


@hookimpl
def register_backbones(register):
    # parameters: load_backbone(name).num_parameters(), the tied input/output embedding counted once
    register("smollm2-135m", smollm2_135m, parameters=134_515_008,
             description="SmolLM2-135M-Instruct, 30 layers, d=576 (embedded, GGUF Q4_1)")
    register("gemma3-270m", gemma3_270m, parameters=268_098_176,
             description="Gemma-3-270M, 18 layers, d=640 (embedded, GGUF Q4_K_M)")
    register("hf", HFBackbone.from_pretrained, handles=handles_hf,
             description="any Hugging Face causal LM, by hub id org/name or local directory")
