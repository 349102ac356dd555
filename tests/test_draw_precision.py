"""Each row's categorical draws are in the precision it records (docs/method.md#sampling): every built-in
baseline states one, and the draws themselves are caught where they happen (torch.multinomial for the
next-token sampler, MDLM's inverse CDF) and their probabilities' dtype compared with what is stated."""

from __future__ import annotations

import pytest
import torch
from dihal_builtin.baselines import mdlm
from dihal_builtin.baselines.ar_scratch import ARScratch

from dihal_bench.api.sampling import NEXT_TOKEN_PRECISION, NO_DRAW
from dihal_bench.hybrid.model import intact_control
from dihal_bench.registry.plugins import get_registry
from dihal_bench.training.budget import Budget

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = {"d_model": 32, "layers": 1, "heads": 2}
BUDGET = Budget(steps=1, batch_size=2, seq_len=8, epochs=1)


@pytest.fixture
def draws(monkeypatch) -> list[torch.dtype]:
    """The dtypes of the probabilities every torch.multinomial call of the test draws from."""
    caught, multinomial = [], torch.multinomial

    def watched(probs, *args, **kwargs):
        caught.append(probs.dtype)
        return multinomial(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", watched)
    return caught


def test_every_built_in_baseline_states_its_draw_precision():
    stated = {name: registration.obj.draw_precision for name, registration in get_registry().items["baseline"].items()
              if registration.obj.__module__.startswith("dihal_builtin.")}
    assert stated and set(stated.values()) <= {"float32", "float64", NO_DRAW}, stated
    assert stated["mdlm"] == "float64" and stated["diffusion-lm"] == stated["sed"] == NO_DRAW


def test_the_next_token_sampler_draws_in_the_precision_its_rows_record(llama_backbone, encode_sentences, draws):
    intact_control(llama_backbone).generate(2, 3, seed=0)
    scratch = ARScratch(llama_backbone, BUDGET, seed=0, **TINY)
    scratch.build_for(encode_sentences(["cats run"], copies=2))
    scratch.trained = True
    scratch.sample(2, 3, seed=0)
    assert draws and set(draws) == {getattr(torch, NEXT_TOKEN_PRECISION)}
    assert ARScratch.draw_precision == NEXT_TOKEN_PRECISION


def test_mdlm_draws_in_float64_and_never_through_multinomial(llama_backbone, encode_sentences, draws, monkeypatch):
    seen, inverse_cdf = [], mdlm.inverse_cdf

    def watched(probs, fraction):
        seen.append((probs.dtype, fraction.dtype))
        return inverse_cdf(probs, fraction)

    monkeypatch.setattr(mdlm, "inverse_cdf", watched)
    model = mdlm.MDLM(llama_backbone, BUDGET, seed=0, **TINY, steps=4)
    model.build_for(encode_sentences(["cats run"], copies=2))
    model.trained = True
    model.sample(2, 8, seed=0)
    assert seen and set(seen) == {(torch.float64, torch.float64)} and not draws
    assert mdlm.MDLM.draw_precision == "float64"
