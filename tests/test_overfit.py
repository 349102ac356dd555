"""Every trained method overfits one window of a tiny synthetic corpus and samples it back
(issue 20, item 4): a method that cannot is broken, whatever its scores elsewhere.

The window is the first WINDOW characters of a seeded word-salad document (conftest's
``text_dir``), one token per character; each method trains on copies of it alone, through its
public API (build, fit, sample), on the tiny random-weight Llama. The baselines must then
sample the window itself, every sample, from any seed. DiHAL's bridge replaces layers 1..ℓ
of the frozen backbone, so what it can give back is the backbone's own text: it trains on
the window that the intact backbone writes greedily from the start token, and the hybrid
must give it back: its bridge's states match h_ℓ on it and its next-token distributions the
backbone's.
"""

from __future__ import annotations

import pytest
import torch
from dihal_builtin.baselines.codar import CoDAR
from dihal_builtin.baselines.diffusion_lm import DiffusionLM
from dihal_builtin.baselines.ld4lg import LD4LG
from dihal_builtin.baselines.sed import SED
from dihal_builtin.bridge import DihalBridge

from dihal_bench.api.bridge import training_loss
from dihal_bench.hybrid.evaluation import bridge_reconstruction, hybrid_against_backbone
from dihal_bench.hybrid.model import HybridLM, intact_control, skip_control
from dihal_bench.hybrid.training import SplitTensors
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import train

WINDOW = 16  # tokens (characters) of the one window
COPIES = 8  # the training set: the window, this many times
SAMPLES = 6  # drawn back, in batches of 4 (a batch split unevenly)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def budget(steps: int) -> Budget:
    # every step sees the same window, so a pass is one batch: epochs cover the steps
    return Budget(steps=steps, batch_size=4, seq_len=WINDOW, lr=3e-3, epochs=steps, seed=0)


@pytest.fixture(scope="module")
def window(text_dir, char_tokenizer) -> torch.Tensor:
    """(WINDOW,) token ids: the start of the corpus's first document."""
    text = (text_dir / "doc00.txt").read_text()[:WINDOW]
    ids = torch.tensor(char_tokenizer(text, add_special_tokens=False)["input_ids"])
    assert ids.shape == (WINDOW,) and len(set(text)) > 5, text
    return ids


def samples_back(model, window: torch.Tensor) -> None:
    for seed in (0, 1):
        sampled = model.sample(SAMPLES, WINDOW, seed=seed, batch_size=4)
        assert sampled.shape == (SAMPLES, WINDOW)
        mismatched = (sampled != window).sum().item()
        assert mismatched == 0, f"seed {seed}: {mismatched} of {sampled.numel()} tokens differ from the window"


# -- the baselines: the window itself, from any seed ------------------------------------------


OVERFIT = {
    "diffusion-lm": (DiffusionLM, {"embed_dim": 8, "d_model": 32, "layers": 2, "heads": 2, "steps": 20}, 150),
    "sed": (SED, {"embed_dim": 8, "d_model": 32, "layers": 2, "heads": 2, "steps": 20}, 150),
    "ld4lg": (LD4LG, {"d_model": 32, "heads": 2, "latents": 2, "latent_dim": 8, "compressor_layers": 1,
                      "decoder_layers": 1, "denoiser_layers": 2, "autoencoder_fraction": 0.3, "steps": 10,
                      "temperature": 0.0}, 200),
    "codar": (CoDAR, {"embed_dim": 8, "d_model": 32, "heads": 2, "denoiser_layers": 2, "decoder_layers": 1,
                      "steps": 10, "temperature": 0.0}, 150),
}


@pytest.mark.parametrize("name", OVERFIT)
def test_a_baseline_overfits_one_window_and_samples_it_back(name, llama_backbone, window):
    cls, options, steps = OVERFIT[name]
    model = cls(llama_backbone, budget(steps), seed=0, **options)
    result = model.fit(window.repeat(COPIES, 1), progress=False)
    assert result.steps_done == steps
    samples_back(model, window)


# -- DiHAL: the bridge through the hybrid LM --------------------------------------------------

LAYER = 2  # of the tiny Llama's 3: layers 1..2 replaced, layer 3 and the head kept


@pytest.mark.parametrize("sampler", ["mean", "ancestral"])
def test_the_dihal_bridge_overfits_the_backbones_window_and_the_hybrid_gives_it_back(sampler, llama_backbone):
    """The bridge samples h_ℓ of its window back (R² > 0.99) and the hybrid's next-token
    distributions on it are the backbone's (KL < 0.01 nats, against the skip control's, which
    deletes layers 1..ℓ). Not token for token: the random backbone's greedy text holds near-ties
    (top-2 logit margins down to 0.004) that any approximation of h_ℓ may flip."""
    backbone = llama_backbone
    intact = intact_control(backbone)
    window = torch.cat([intact.start_ids(1), intact.generate(1, WINDOW - 1, temperature=1e-6, seed=0)], dim=1)
    assert len(window.unique()) > 5, window  # a real text, not one repeated token
    windows = window.repeat(COPIES, 1)
    states = backbone.hidden_states(windows)
    data = SplitTensors(windows, {0: states[0], LAYER: states[LAYER]})
    torch.manual_seed(0)
    bridge = DihalBridge(backbone.width, d_model=32, layers=2, heads=2, steps=4, sampler=sampler)
    bridge.fit_standardizer(data.states[0], data.states[LAYER], data.mask)
    train(bridge, training_loss, {"cond": data.states[0], "target": data.states[LAYER], "mask": data.mask},
          budget(300), progress=False)

    assert bridge_reconstruction(bridge, data.states[0], data.states[LAYER], data.mask)["r2"] > 0.99
    hybrid = hybrid_against_backbone(backbone, HybridLM(backbone, bridge, LAYER), window)["kl"]
    skipped = hybrid_against_backbone(backbone, skip_control(backbone, LAYER), window)["kl"]
    assert hybrid < 0.01 and hybrid < skipped / 100, (hybrid, skipped)
