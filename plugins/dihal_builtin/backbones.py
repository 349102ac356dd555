"""Built-in backbones: the two embedded GGUF models and any Hugging Face causal LM."""

from dihal_bench import hookimpl

from .embedded import gemma3_270m, smollm2_135m
from .hf_backbone import HFBackbone


@hookimpl
def register_backbones(register):
    register("smollm2-135m", smollm2_135m, description="SmolLM2-135M-Instruct, 30 layers, d=576 (embedded, GGUF Q4_1)")
    register("gemma3-270m", gemma3_270m, description="Gemma-3-270M, 18 layers, d=640 (embedded, GGUF Q4_K_M)")
    register("hf", HFBackbone.from_pretrained, description="any Hugging Face causal LM id or local directory")
