"""HFBackbone on tiny random-weight Llama, Qwen3 and Gemma3 models: entering the layer stack
at any index must reproduce the library's own forward pass."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from conftest import declared_requirement
from dihal_builtin import compat
from dihal_builtin.hf_backbone import HFBackbone, resolve_dtype
from transformers import GPT2Config, GPT2LMHeadModel

from dihal_bench.api.conformance import check_backbone
from dihal_bench.errors import DihalError
from dihal_bench.registry.resolve import load_backbone

FAMILIES = ("llama", "qwen3", "gemma3")
VOCAB = 128  # the tiny models' (conftest.py)
WINDOW = 8  # the tiny Gemma3's sliding window
LENGTHS = (21, 13)  # both longer than the window, and different, so row 2 is padded
ATOL = 1e-5


@pytest.fixture(params=FAMILIES)
def backbone(request, tiny_models, char_tokenizer) -> HFBackbone:
    return HFBackbone(tiny_models[request.param], char_tokenizer, f"tiny-{request.param}")


def padded_batch(lengths=LENGTHS, seed: int = 0, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids padded with id 0 on ``side``, and the matching attention mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        where = slice(0, length) if side == "right" else slice(max(lengths) - length, None)
        ids[row, where] = torch.randint(3, VOCAB, (length,), generator=generator)
        mask[row, where] = 1
    return ids, mask


def test_tiny_models_have_the_intended_shapes(tiny_models, char_tokenizer):
    shapes = {family: HFBackbone(model, char_tokenizer, family) for family, model in tiny_models.items()}
    assert {family: (b.num_layers, b.width, b.vocab_size) for family, b in shapes.items()} == {
        "llama": (3, 32, VOCAB), "qwen3": (4, 32, VOCAB), "gemma3": (4, 32, VOCAB),
    }
    assert {family: b.sliding_window for family, b in shapes.items()} == {
        "llama": None, "qwen3": None, "gemma3": WINDOW,
    }
    gemma3 = shapes["gemma3"]
    assert gemma3.num_parameters() == sum(p.numel() for p in tiny_models["gemma3"].parameters())
    assert gemma3.describe() == {
        "name": "gemma3", "layers": 4, "width": 32, "vocab": VOCAB,
        "parameters": gemma3.num_parameters(), "dtype": "float32", "device": "cpu",
    }


# Right padding is what the harness uses; left padding is here because only there does the
# attention mask change real positions (causal attention never reaches right padding).
@pytest.mark.parametrize("side", ["right", "left"])
def test_resume_from_every_layer_equals_the_library_logits(backbone, side):
    ids, mask = padded_batch(side=side)
    real = mask.bool()
    full = backbone.logits(ids, mask)
    states = backbone.hidden_states(ids, mask)
    for layer, hidden in enumerate(states):
        resumed = backbone.resume(hidden, layer, mask)
        assert resumed.shape == (2, max(LENGTHS), VOCAB)
        torch.testing.assert_close(resumed[real], full[real], atol=ATOL, rtol=0, msg=f"resume from layer {layer}")
    # the comparison has teeth: resuming one layer too high is far off
    wrong = backbone.resume(states[1], 2, mask)
    assert (wrong - full)[real].abs().max() > 0.1


def test_padded_row_equals_the_sequence_alone(backbone):
    ids, mask = padded_batch()
    short = LENGTHS[1]
    batched = backbone.hidden_states(ids, mask)
    alone = backbone.hidden_states(ids[1:, :short])
    for layer, (b, a) in enumerate(zip(batched, alone)):
        torch.testing.assert_close(b[1, :short], a[0], atol=ATOL, rtol=0, msg=f"hidden state {layer}")


@pytest.mark.parametrize("side", ["right", "left"])
def test_truncated_hidden_states_are_the_full_ones(backbone, side):
    """``up_to=l`` runs the very same operations on the same inputs as the first l layers of
    the full pass (same batch, masks and rotary tables), so on one machine the result is
    bitwise equal, not merely close. Gemma3's prefixes cover a sliding-only stack (l ≤ 2)
    and a mixed one (l ≥ 3)."""
    ids, mask = padded_batch(side=side)
    full = backbone.hidden_states(ids, mask)
    for depth in range(backbone.num_layers + 1):
        truncated = backbone.hidden_states(ids, mask, up_to=depth)
        assert len(truncated) == depth + 1
        for layer, (got, expected) in enumerate(zip(truncated, full)):
            assert torch.equal(got, expected), f"up_to={depth}, hidden state {layer}"
    assert len(backbone.hidden_states(ids, mask, up_to=None)) == backbone.num_layers + 1


def test_truncated_hidden_states_run_only_the_layers_below(backbone):
    """The cost claim: ``up_to=l`` calls decoder layers 1..l and no other."""
    calls = []
    hooks = [layer.register_forward_hook(lambda module, args, out, i=i: calls.append(i))
             for i, layer in enumerate(backbone.base.layers)]
    try:
        ids, _ = padded_batch()
        for depth in range(backbone.num_layers + 1):
            calls.clear()
            backbone.hidden_states(ids, up_to=depth)
            assert calls == list(range(depth)), f"up_to={depth}"
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("up_to", [-1, 5, True, 2.0, "2"])
def test_truncated_hidden_states_out_of_range_is_a_clear_error(tiny_models, char_tokenizer, up_to):
    backbone = HFBackbone(tiny_models["qwen3"], char_tokenizer, "tiny-qwen3")
    expected = re.escape(f"up_to={up_to!r} is out of range for tiny-qwen3: choose 0..4 (4 layers)")
    with pytest.raises(DihalError, match=f"^{expected}$"):
        backbone.hidden_states(torch.tensor([[5, 6, 7]]), up_to=up_to)


def test_sliding_window_is_active_in_these_sequences(tiny_models, char_tokenizer):
    """The Gemma3 checks above only test local attention if the window actually cuts
    context: the same weights with an unbounded window agree inside the window only."""
    local = tiny_models["gemma3"]
    config = copy.deepcopy(local.config)
    config.sliding_window = 1000
    unbounded = type(local)(config).eval()
    unbounded.load_state_dict(local.state_dict())
    ids, _ = padded_batch(lengths=(LENGTHS[0],))
    with torch.no_grad():
        a, b = local(ids).logits[0], unbounded(ids).logits[0]
    torch.testing.assert_close(a[:WINDOW], b[:WINDOW], atol=ATOL, rtol=0)
    assert (a[WINDOW:] - b[WINDOW:]).abs().max() > 1e-3


def test_hidden_states_are_embedding_then_one_per_layer(backbone):
    ids, mask = padded_batch()
    states = backbone.hidden_states(ids, mask)
    assert len(states) == backbone.num_layers + 1
    assert all(s.shape == (2, max(LENGTHS), backbone.width) for s in states)
    assert torch.equal(states[0], backbone.embed(ids))
    real = mask.bool()
    torch.testing.assert_close(
        backbone.final_hidden(ids, mask)[real], backbone.base.norm(states[-1])[real], atol=ATOL, rtol=0
    )


def test_one_pass_logits_and_final_hidden_are_the_two_library_calls(backbone):
    # The same library operations in the same order (the tiny Gemma3 sets a soft cap its head
    # must apply), so the values are equal, not merely close.
    ids, mask = padded_batch()
    logits, hidden = backbone.logits_and_final_hidden(ids, mask)
    assert torch.equal(logits, backbone.logits(ids, mask))
    assert torch.equal(hidden, backbone.final_hidden(ids, mask))


@pytest.mark.parametrize("position", ["first", "last"])
def test_incremental_resume_with_a_cache_equals_the_uncached_resume(backbone, position):
    """What KV-cached generation relies on: feed a prefix, then one position at a time."""
    layer = 1 if position == "first" else backbone.num_layers - 1
    ids, _ = padded_batch(lengths=(20, 20), seed=1)  # 20 > the sliding window
    hidden = backbone.hidden_states(ids)[layer]
    prefix = 5
    cache = backbone.new_cache()
    got = backbone.resume(hidden[:, :prefix], layer, cache=cache)
    torch.testing.assert_close(got, backbone.resume(hidden[:, :prefix], layer), atol=ATOL, rtol=0)
    for t in range(prefix, ids.shape[1]):
        step = backbone.resume(hidden[:, t : t + 1], layer, cache=cache, position_offset=t)
        expected = backbone.resume(hidden[:, : t + 1], layer)[:, -1:]
        torch.testing.assert_close(step, expected, atol=ATOL, rtol=0, msg=f"layer {layer}, position {t}")


def test_conformance_check_passes(backbone):
    report = check_backbone(backbone)
    assert report["passed"]
    assert len(report["max_abs_diff"]) == backbone.num_layers + 1
    assert report["worst_relative"] <= 1e-5
    assert report["probe_tokens"] > 2 * WINDOW
    assert len(report["truncated_relative_diff"]) == backbone.num_layers + 1
    assert max(report["truncated_relative_diff"]) == 0.0  # the same operations on the same inputs


def test_conformance_check_fails_a_backbone_whose_truncated_pass_differs(backbone, monkeypatch):
    honest = backbone.hidden_states

    def drifting(input_ids, attention_mask=None, *, up_to=None):
        states = honest(input_ids, attention_mask, up_to=up_to)
        return states if up_to is None else [*states[:-1], states[-1] * 1.01]

    monkeypatch.setattr(backbone, "hidden_states", drifting)
    report = check_backbone(backbone)
    assert not report["passed"] and report["worst_relative"] <= 1e-5
    assert max(report["truncated_relative_diff"]) == pytest.approx(0.01, rel=1e-3)


def test_bfloat16_model_gives_bfloat16_logits_close_to_float32(tiny_models, char_tokenizer):
    float32 = HFBackbone(tiny_models["gemma3"], char_tokenizer, "tiny-gemma3")
    bfloat16 = HFBackbone(copy.deepcopy(tiny_models["gemma3"]).to(torch.bfloat16), char_tokenizer, "tiny-gemma3-bf16")
    assert bfloat16.dtype == torch.bfloat16 and bfloat16.describe()["dtype"] == "bfloat16"
    ids, mask = padded_batch()
    real = mask.bool()
    reference = float32.logits(ids, mask)
    scale = reference[real].abs().max()
    library = bfloat16.logits(ids, mask)
    resumed = bfloat16.resume(bfloat16.hidden_states(ids, mask)[2], 2, mask)
    # the head also accepts float32 input: it is cast to the model's dtype
    from_float32 = bfloat16.resume(float32.hidden_states(ids, mask)[2], 2, mask)
    for logits in (library, resumed, from_float32):
        assert logits.dtype == torch.bfloat16
        assert (logits.float() - reference)[real].abs().max() < 0.1 * scale


def test_resolve_dtype():
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(DihalError, match=r"^unknown dtype 'float64'; choose one of float32, float16, bfloat16$"):
        resolve_dtype("float64")


def test_check_layer_bounds(tiny_models, char_tokenizer):
    backbone = HFBackbone(tiny_models["qwen3"], char_tokenizer, "tiny-qwen3")
    assert [backbone.check_layer(layer) for layer in (1, 3)] == [1, 3]
    assert backbone.check_layer(4, allow_last=True) == 4
    for layer, allow_last in [(0, False), (4, False), (-1, False), (0, True), (5, True)]:
        top = 4 if allow_last else 3
        expected = rf"^layer {layer} is out of range for tiny-qwen3: choose 1..{top} \(4 layers\)$"
        with pytest.raises(DihalError, match=expected):
            backbone.check_layer(layer, allow_last=allow_last)


def test_unsupported_architecture_is_a_clear_error(char_tokenizer):
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=16, n_layer=2, n_head=2,
                                      bos_token_id=1, eos_token_id=1))
    with pytest.raises(DihalError, match=r"^tiny-gpt2: unsupported architecture GPT2LMHeadModel; expected model.model"):
        HFBackbone(gpt2, char_tokenizer, "tiny-gpt2")


def test_tokenizer_without_pad_token_gets_eos(tiny_models, char_tokenizer):
    tokenizer = copy.deepcopy(char_tokenizer)
    tokenizer.pad_token = None
    backbone = HFBackbone(tiny_models["llama"], tokenizer, "tiny-llama")
    assert backbone.tokenizer.pad_token_id == tokenizer.eos_token_id == 1


# --- loading from a local directory, through the hub code path -------------------------------


def test_from_pretrained_local_directory(tiny_model_dir, tiny_models):
    backbone = HFBackbone.from_pretrained(tiny_model_dir, name="tiny")
    assert (backbone.name, backbone.num_layers, backbone.sliding_window) == ("tiny", 4, WINDOW)
    assert backbone.tokenizer("ab\n")["input_ids"] == [13, 14, 99]
    ids, mask = padded_batch()
    real = mask.bool()
    with torch.no_grad():
        original = tiny_models["gemma3"](input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(backbone.logits(ids, mask)[real], original[real], atol=0, rtol=0)


def test_load_backbone_takes_a_local_directory(tiny_model_dir):
    backbone = load_backbone(tiny_model_dir, dtype="bfloat16")
    assert isinstance(backbone, HFBackbone)
    assert (backbone.name, backbone.dtype) == (tiny_model_dir, torch.bfloat16)
    assert next(backbone.model.parameters()).dtype == torch.bfloat16


def test_load_backbone_unknown_name():
    with pytest.raises(DihalError, match=r"^unknown backbone 'no-such-backbone'; known: .*smollm2-135m"):
        load_backbone("no-such-backbone")


def test_from_pretrained_directory_without_weights_is_a_clear_error(tiny_model_dir, tmp_path):
    for file in Path(tiny_model_dir).iterdir():
        if file.name != "model.safetensors":
            shutil.copy(file, tmp_path)
    # 4.x lists every weight format it looked for, 5.x the safetensors one alone
    with pytest.raises(DihalError, match=rf"^cannot load backbone '{tmp_path}': .*no file named .*model.safetensors"):
        HFBackbone.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("contents", ["nothing", "only a tokenizer"])
def test_from_pretrained_directory_without_a_model_is_a_clear_error(tmp_path, char_tokenizer, contents):
    if contents == "only a tokenizer":
        char_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(DihalError, match=r"^cannot load backbone"):
        HFBackbone.from_pretrained(str(tmp_path))


def test_describe_and_tokenizer_read_no_weights_and_match_the_loaded_backbone(tiny_model_dir, tmp_path):
    """The hooks the pre-flight checks call agree with the loaded model, and work with the
    weights file gone (so they never read it)."""
    import dihal_builtin.hf_backbone as hf

    loaded = load_backbone(tiny_model_dir)
    bare = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, bare, ignore=shutil.ignore_patterns("*.safetensors"))
    assert hf.describe_pretrained(str(bare)) == {"layers": loaded.num_layers, "width": loaded.width}
    text = "def f(x):\n    return x"
    tokenizer = hf.pretrained_tokenizer(str(bare))
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == loaded.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_installed_transformers_is_in_the_declared_range(record_property):
    """CI runs this under the newest and the lowest resolution: the version it ran under is
    in the report header (conftest.py) and here, as a recorded property."""
    installed = transformers.__version__
    record_property("transformers", installed)
    specifier = declared_requirement("transformers").specifier
    assert specifier.contains(installed, prereleases=True), f"transformers {installed} is outside {specifier}"


class _OldLayer(torch.nn.Module):
    """A decoder layer with 4.53's keywords: the singular cache name and cache_position."""

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                use_cache=False, cache_position=None, position_embeddings=None):
        self.seen = {"cache": past_key_value, "cache_position": cache_position, "rotary": position_embeddings}
        return (hidden_states + 1,)


class _TwoTableLayer(torch.nn.Module):
    """Gemma3's 4.x decoder layer: both rotary tables, the plural cache name."""

    def forward(self, hidden_states, position_embeddings_global, position_embeddings_local, attention_mask=None,
                position_ids=None, past_key_values=None, use_cache=False, cache_position=None, **kwargs):
        self.seen = {"cache": past_key_values, "global": position_embeddings_global,
                     "local": position_embeddings_local, "extra": kwargs}
        return hidden_states * 2


class _NewLayer(torch.nn.Module):
    """5.24's keywords: ``cache``, no cache_position; anything else would land in ``kwargs``."""

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                position_embeddings=None, **kwargs):
        self.seen = {"cache": cache, "extra": kwargs}
        return hidden_states


@pytest.mark.parametrize("layer_class", [_OldLayer, _TwoTableLayer, _NewLayer])
def test_compat_passes_each_release_s_keywords(layer_class):
    hidden, positions, marker = torch.zeros(1, 3, 2), torch.arange(5, 8)[None], object()
    rotary = {"full_attention": "global", "sliding_attention": "local"}
    layer = layer_class()
    out = compat.run_layer(layer, hidden, mask=None, rotary=rotary, kind="sliding_attention", positions=positions,
                           cache_object=marker)
    assert layer.seen["cache"] is marker
    assert layer.seen.get("extra", {}) == {}  # no keyword of another release slipped into **kwargs
    if layer_class is _OldLayer:
        assert torch.equal(layer.seen["cache_position"], torch.arange(5, 8)) and layer.seen["rotary"] == "local"
        assert torch.equal(out, hidden + 1)
    if layer_class is _TwoTableLayer:
        assert (layer.seen["global"], layer.seen["local"]) == ("global", "local")
        assert compat.needs_all_rotaries([layer]) and not compat.needs_all_rotaries([_NewLayer()])


def test_compat_refuses_a_layer_without_a_cache_argument():
    class Layer(torch.nn.Module):
        def forward(self, hidden_states, attention_mask=None):
            return hidden_states

    with pytest.raises(DihalError, match=r"^Layer.forward takes no cache argument"):
        compat.run_layer(Layer(), torch.zeros(1, 1, 1), mask=None, rotary={"full_attention": None},
                         kind="full_attention", positions=torch.zeros(1, 1, dtype=torch.long), cache_object=None)
