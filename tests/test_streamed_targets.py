"""Streamed bridge targets: a bridge trained on states computed per batch is the bridge trained
on stored states, and the streamed path never holds more than a batch of them."""

from __future__ import annotations

import pytest
import torch

from dihal_bench.hybrid.training import (
    STANDARDIZER_CHUNK,
    BridgeSpec,
    StreamedStates,
    train_bridge,
    train_bridge_streamed,
    with_states,
)
from dihal_bench.training.budget import Budget

LAYER = 2
SPEC = BridgeSpec(options={"d_model": 16, "layers": 1, "heads": 2}, sample_steps=2,
                  budget=Budget(steps=6, batch_size=4, seq_len=12, epochs=3, checkpoint_every=3, lr=1e-3))


def text_windows(count: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 100, (count, SPEC.budget.seq_len), generator=torch.Generator().manual_seed(seed))


def test_streamed_targets_train_the_bridge_the_stored_ones_do(llama_backbone, tmp_path):
    stored = with_states(llama_backbone, text_windows(12), [LAYER], progress=False)
    bridge, stats = train_bridge(llama_backbone, SPEC, LAYER, stored, progress=False)
    streamed, streamed_stats = train_bridge_streamed(llama_backbone, SPEC, LAYER, stored.sequences,
                                                     tmp_path / "checkpoint", progress=False)

    # The states differ only by the float32 rounding of other batch shapes (a few ulps of
    # activations of order 1), the standardiser's float64 moments by as little, and six AdamW
    # steps move each weight by at most ~lr per step with updates that follow the gradient's
    # sign: 1e-4 relative on the loss and 1e-5 absolute on weights of a 16-wide bridge covers
    # that rounding while a different seed, batch or layer is off by orders of magnitude more.
    assert streamed_stats["steps"] == stats["steps"] == 6
    assert streamed_stats["final_loss"] == pytest.approx(stats["final_loss"], rel=1e-4)
    for name, tensor in bridge.state_dict().items():
        torch.testing.assert_close(streamed.state_dict()[name], tensor, rtol=1e-4, atol=1e-5, msg=name)

    other_layer, _ = train_bridge_streamed(llama_backbone, SPEC, LAYER - 1, stored.sequences, progress=False)
    assert not torch.allclose(other_layer.target_std, bridge.target_std, rtol=1e-3)


def test_streamed_targets_resume_to_the_same_bridge(llama_backbone, tmp_path, monkeypatch):
    windows = with_states(llama_backbone, text_windows(12), [], progress=False).sequences
    whole, _ = train_bridge_streamed(llama_backbone, SPEC, LAYER, windows, progress=False)

    calls, original = [], StreamedStates.loss

    def dies_at_step_five(self, bridge, batch, generator):
        calls.append(1)
        if len(calls) == 5:  # after the checkpoint at step 3, as a kill would
            raise KeyboardInterrupt
        return original(self, bridge, batch, generator)

    with monkeypatch.context() as patch:
        patch.setattr(StreamedStates, "loss", dies_at_step_five)
        with pytest.raises(KeyboardInterrupt):
            train_bridge_streamed(llama_backbone, SPEC, LAYER, windows, tmp_path, progress=False)
    calls.clear()
    with monkeypatch.context() as patch:
        patch.setattr(StreamedStates, "loss", lambda self, *args: calls.append(1) or original(self, *args))
        resumed, stats = train_bridge_streamed(llama_backbone, SPEC, LAYER, windows, tmp_path, progress=False)
    assert stats["steps"] == 6 and len(calls) == 3  # steps 4..6 only: resumed from the checkpoint at 3
    assert all(torch.equal(resumed.state_dict()[name], tensor) for name, tensor in whole.state_dict().items())


@pytest.mark.parametrize("count", [12, 96])
def test_streamed_targets_hold_one_batch_of_states_whatever_the_split(llama_backbone, count, monkeypatch):
    rows_seen = []
    original = StreamedStates.__call__

    def counting(self, windows):
        rows_seen.append(len(windows))
        return original(self, windows)

    monkeypatch.setattr(StreamedStates, "__call__", counting)
    windows = with_states(llama_backbone, text_windows(count, seed=1), [], progress=False).sequences
    train_bridge_streamed(llama_backbone, SPEC, LAYER, windows, progress=False)
    # every forward pass is one training batch or one standardiser chunk, never the split
    assert max(rows_seen) == max(SPEC.budget.batch_size, min(count, STANDARDIZER_CHUNK))
    assert sum(rows_seen) == count + SPEC.budget.steps * SPEC.budget.batch_size


def test_a_streamed_sweep_measures_what_the_stored_one_does(llama_backbone, text_dir, monkeypatch):
    from dihal_bench.hybrid import training as bridge_training
    from dihal_bench.hybrid.sweep import run_sweep
    from dihal_bench.registry.resolve import load_corpus

    extracted = []
    original = bridge_training.extract_layers

    def recording(backbone, windows, layers, **kwargs):
        extracted.append(list(layers))
        return original(backbone, windows, layers, **kwargs)

    monkeypatch.setattr(bridge_training, "extract_layers", recording)
    spec = BridgeSpec(options={"d_model": 16, "layers": 1, "heads": 2}, sample_steps=2,
                      budget=Budget(steps=2, batch_size=2, seq_len=16))
    corpus = load_corpus(str(text_dir))
    stored = run_sweep(llama_backbone, corpus, [1, 2], spec, eval_sequences=3, progress=False)
    extracted.clear()
    streamed = run_sweep(llama_backbone, corpus, [1, 2], spec, eval_sequences=3, progress=False, stream_targets=True)
    # no stored states: the validation windows' states one swept layer at a time (and the condition, 0)
    assert extracted == [[0, 1], [0, 2]]
    assert streamed["train_sequences"] == stored["train_sequences"]
    for ours, theirs in zip(streamed["layers"], stored["layers"]):
        assert ours["layer"] == theirs["layer"]
        # two AdamW steps on states equal up to float32 rounding of other batch shapes
        for key in ("final_loss", "bridge_mse", "hybrid_ppl"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4), key
