"""Reading only what is needed: forward passes that stop at the deepest layer asked for,
locate's token sample drawn from as few sequences as hold it, and proxies that fail in a
plugin reported in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dihal_builtin.hf_backbone import HFBackbone

from dihal_bench import hookimpl
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.training import bridge_windows, with_states
from dihal_bench.locate.geometry import run_proxy
from dihal_bench.locate.hidden_states import (
    extract_layers,
    extract_sampled,
    sample_positions,
)
from dihal_bench.locate.pipeline import LocateConfig, locate, proxy_origin
from dihal_bench.registry.resolve import load_corpus

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAMILIES = ("llama", "qwen3", "gemma3")
VOCAB = 128  # the tiny models' (conftest.py)


@pytest.fixture(params=FAMILIES)
def backbone(request, tiny_models, char_tokenizer) -> HFBackbone:
    return HFBackbone(tiny_models[request.param], char_tokenizer, f"tiny-{request.param}")


@pytest.fixture
def qwen3(tiny_models, char_tokenizer) -> HFBackbone:
    return HFBackbone(tiny_models["qwen3"], char_tokenizer, "tiny-qwen3")


def random_sequences(n: int, length: int, seed: int = 0) -> torch.Tensor:
    # 20 > the tiny Gemma3's sliding window of 8, so its local layers cut context here
    return torch.randint(3, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


class LayerCalls:
    """Records which decoder layers (0-based) run, through forward hooks."""

    def __init__(self, backbone: HFBackbone):
        self.seen: set[int] = set()
        self.hooks = [layer.register_forward_hook(lambda module, args, out, i=i: self.seen.add(i))
                      for i, layer in enumerate(backbone.base.layers)]

    def __enter__(self) -> LayerCalls:
        return self

    def __exit__(self, *exc) -> None:
        for hook in self.hooks:
            hook.remove()


# -- bridge targets: extract_layers / with_states -------------------------------------------------


def test_bridge_targets_stop_at_the_deepest_layer_and_equal_the_full_pass(backbone):
    """Each batch's truncated pass is the full pass's first layers (bitwise, see
    test_hf_backbone.py), so the targets equal slices of full passes over the same batches."""
    sequences = random_sequences(5, 20)
    with LayerCalls(backbone) as calls:
        targets = extract_layers(backbone, sequences, [0, 2], batch_size=2, progress=False)
    assert calls.seen == {0, 1}  # layers 1 and 2, nothing deeper
    assert sorted(targets) == [0, 2]
    for start in range(0, 5, 2):
        full = backbone.hidden_states(sequences[start:start + 2])
        for layer in (0, 2):
            assert torch.equal(targets[layer][start:start + 2], full[layer]), f"layer {layer}, batch at {start}"


def test_with_states_adds_the_condition_and_stops_at_max_layers(qwen3):
    sequences = random_sequences(3, 12, seed=1)
    with LayerCalls(qwen3) as calls:
        data = with_states(qwen3, sequences, [3, 1], progress=False)
    assert calls.seen == {0, 1, 2}
    assert sorted(data.states) == [0, 1, 3]
    assert torch.equal(data.sequences, bridge_windows(qwen3, sequences))  # the start token, then the text
    full = qwen3.hidden_states(data.sequences)
    assert all(torch.equal(data.states[layer], full[layer]) for layer in (0, 1, 3))


def test_bridge_targets_at_the_last_layer_run_the_whole_stack(qwen3):
    with LayerCalls(qwen3) as calls:
        extract_layers(qwen3, random_sequences(2, 8), [qwen3.num_layers], progress=False)
    assert calls.seen == set(range(qwen3.num_layers))


@pytest.mark.parametrize("layer", [-1, 5])
def test_bridge_targets_out_of_range_is_a_clear_error(qwen3, layer):
    with pytest.raises(DihalError, match=rf"^layer {layer} is out of range for tiny-qwen3: choose 0\.\.4 \(4 layers\)$"):
        extract_layers(qwen3, random_sequences(2, 8), [0, layer], progress=False)


# -- locate's sample ---------------------------------------------------------------------------------


def test_sampled_tokens_come_from_the_fewest_sequences_that_hold_them():
    n_sequences, seq_len, n_tokens = 200, 16, 100
    positions = sample_positions(n_sequences, seq_len, n_tokens, seed=0)
    assert positions.shape == (n_tokens, 2)
    # ⌈100 / 15⌉ = 7; every one of the 7 picked sequences holds a token, since 6 hold at most 90
    assert len(positions[:, 0].unique()) == math.ceil(n_tokens / (seq_len - 1)) == 7
    assert positions[:, 1].min() >= 1 and positions[:, 1].max() <= seq_len - 1  # never the sink
    keys = positions[:, 0] * seq_len + positions[:, 1]
    assert len(keys.unique()) == n_tokens and torch.equal(keys, keys.sort().values)  # distinct, sorted
    assert positions[:, 0].max() >= 7  # picked by a seeded permutation, not the first sequences


def test_sampled_tokens_are_reproducible_from_the_seed():
    first = sample_positions(200, 16, 100, seed=3)
    assert torch.equal(first, sample_positions(200, 16, 100, seed=3))
    assert not torch.equal(first, sample_positions(200, 16, 100, seed=4))


def test_sampled_tokens_can_be_spread_over_more_sequences():
    positions = sample_positions(200, 16, 100, seed=0, sequences=50)
    assert 7 < len(positions[:, 0].unique()) <= 50
    everything = sample_positions(7, 16, 105, seed=0)  # all positions of all sequences
    assert len(everything) == 105 and len(everything[:, 0].unique()) == 7


def test_sampled_token_errors():
    with pytest.raises(DihalError, match=r"^--tokens 106 exceeds the 105 token positions available \(7 sequences x 15"):
        sample_positions(7, 16, 106, seed=0)
    with pytest.raises(DihalError, match=r"^--tokens 0 is too small"):
        sample_positions(7, 16, 0, seed=0)
    for sequences in (6, 8):
        with pytest.raises(DihalError, match=rf"^sequences={sequences} is out of range: 100 tokens need 7\.\.7 of"):
            sample_positions(7, 16, 100, seed=0, sequences=sequences)


def test_extract_sampled_gives_each_sampled_token_its_hidden_states(backbone):
    sequences = random_sequences(9, 20, seed=2)
    positions = sample_positions(len(sequences), 20, 40, seed=0, sequences=5)
    full = backbone.hidden_states(sequences)
    states = extract_sampled(backbone, sequences, positions, batch_size=2, progress=False)
    assert states.shape == (backbone.num_layers + 1, 40, backbone.width)
    rows, columns = positions[:, 0], positions[:, 1]
    # float32 throughout; only the batch split differs from the reference pass, which may
    # change the summation order of a few reductions: ~10 rounding steps of 2^-24 relative
    # on O(1)–O(10) activations is far below 1e-5
    for layer in range(backbone.num_layers + 1):
        torch.testing.assert_close(states[layer], full[layer][rows, columns], atol=1e-5, rtol=1e-5)
    with LayerCalls(backbone) as calls:
        shallow = extract_sampled(backbone, sequences, positions, batch_size=2, progress=False, up_to=1)
    assert calls.seen == {0} and torch.equal(shallow, states[:2])


def test_locate_runs_the_model_only_on_the_sequences_it_samples(qwen3, text_dir, monkeypatch):
    real = qwen3.hidden_states
    rows_run = []

    def counting(input_ids, attention_mask=None, **options):
        rows_run.append(len(input_ids))
        return real(input_ids, attention_mask, **options)

    monkeypatch.setattr(qwen3, "hidden_states", counting)
    config = LocateConfig(tokens=50, seq_len=32, proxies=("effective_rank", "global_monotonicity"),
                          params={"global_monotonicity": {"pairs": 256}})
    result = locate(qwen3, load_corpus(str(text_dir)), config, progress=False)
    assert sum(rows_run) == result["sequences_read"] == math.ceil(50 / 31) == 2
    # drawn from the whole split, 50 positions would touch nearly every one of its sequences
    assert result["sequences_available"] >= 5 * result["sequences_read"]
    assert result["tokens_sampled"] == 50 and result["config"]["sequences"] is None


# -- proxies that fail ----------------------------------------------------------------------------------


def divide_by_zero(hidden) -> float:
    raise ZeroDivisionError("the top two eigenvalues coincide\na second line that the report leaves out")


class RaisingPlugin:
    @hookimpl
    def register_proxies(self, register):
        register("test-raising", divide_by_zero, higher_is_better=True)


def test_locate_reports_a_raising_proxy_with_its_plugin_in_one_line(qwen3, text_dir, inline_plugin):
    inline_plugin(RaisingPlugin(), "raising-plugin")
    config = LocateConfig(tokens=64, seq_len=32, proxies=("effective_rank", "test-raising"))
    with pytest.raises(DihalError) as caught:
        locate(qwen3, load_corpus(str(text_dir)), config, progress=False)
    assert str(caught.value) == ("proxy 'test-raising' (plugin raising-plugin, not installed) failed on layer 1: "
                                 "ZeroDivisionError: the top two eigenvalues coincide")
    assert isinstance(caught.value.__cause__, ZeroDivisionError)  # kept for --debug


def test_proxy_origin_names_plugin_and_distribution():
    assert proxy_origin("effective_rank").startswith("plugin proxies from dihal-bench ")


HIDDEN = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("value, message", [
    (math.nan, "returned nan on layer 3"),
    (-math.inf, "returned -inf on layer 3"),
    (torch.tensor(math.inf), "returned inf on layer 3"),
    ("0.5", "returned a str on layer 3, not a number"),
    (None, "returned a NoneType on layer 3, not a number"),
    (True, "returned a bool on layer 3, not a number"),
    (torch.ones(3), r"returned a Tensor of shape \(3,\) on layer 3, not a number"),
    (1 + 2j, "returned a complex on layer 3, not a number"),
])
def test_a_proxy_value_that_is_not_a_finite_number_is_a_clear_error(value, message):
    with pytest.raises(DihalError, match=rf"^proxy 'odd' \(plugin odd-plugin, not installed\) {message}$"):
        run_proxy("odd", lambda hidden: value, HIDDEN, {}, 3, "plugin odd-plugin, not installed")


@pytest.mark.parametrize("value", [2, 2.0, np.float32(2.0), np.int64(2), torch.tensor([2.0]), np.array(2.0)])
def test_any_real_scalar_is_a_proxy_value(value):
    assert run_proxy("ok", lambda hidden: value, HIDDEN, {}, 1) == 2.0


def test_a_proxy_error_message_gets_the_proxy_name_without_a_traceback():
    def refuses(hidden, *, k: int = 3):
        raise DihalError(f"need more than k={k} points")

    with pytest.raises(DihalError, match=r"^proxy 'refuses' failed on layer 2: need more than k=5 points$"):
        run_proxy("refuses", refuses, HIDDEN, {"k": 5}, 2)
