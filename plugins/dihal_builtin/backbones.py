"""Built-in backbones: the two embedded GGUF models and any Hugging Face causal LM."""

from pathlib import Path

from dihal_bench import hookimpl

from .embedded import (
    gemma3_270m,
    gemma3_270m_shape,
    gemma3_270m_tokenizer,
    smollm2_135m,
    smollm2_135m_shape,
    smollm2_135m_tokenizer,
)
from .hf_backbone import (
    HFBackbone,
    describe_pretrained,
    evaluator_from_pretrained,
    pretrained_parameters,
    pretrained_tokenizer,
)


def handles_hf(reference: str) -> bool:
    """A local model directory, or a Hugging Face hub id ``org/name``."""
    if Path(reference).is_dir():
        return True
    parts = reference.split("/")
    return len(parts) == 2 and all(parts) and not reference.startswith((".", "/"))


@hookimpl
def register_backbones(register):
    # parameters: load_backbone(name).num_parameters(), the tied input/output embedding counted once
    # describe and tokenizer: what the pre-flight checks read instead of the weights
    register("smollm2-135m", smollm2_135m, parameters=134_515_008,
             describe=smollm2_135m_shape, tokenizer=smollm2_135m_tokenizer,
             description="SmolLM2-135M-Instruct, 30 layers, d=576 (embedded, GGUF Q4_1)")
    register("gemma3-270m", gemma3_270m, parameters=268_098_176,
             describe=gemma3_270m_shape, tokenizer=gemma3_270m_tokenizer,
             description="Gemma-3-270M, 18 layers, d=640 (embedded, GGUF Q4_K_M)")
    register("hf", HFBackbone.from_pretrained, handles=handles_hf, parameters=pretrained_parameters,
             describe=describe_pretrained, tokenizer=pretrained_tokenizer, evaluator=evaluator_from_pretrained,
             description="any Hugging Face causal LM, by hub id org/name or local directory")
