"""GatedDeltaNet against transformers' Qwen3_5GatedDeltaNet: same parameter names and shapes, state_dicts
load both ways with strict=True, same outputs and same gradients (input and every parameter); config
validation; the layer in bf16; prefill states in transformers' cache layout, and decoding from them."""

from __future__ import annotations

import copy
import dataclasses
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache
from transformers.models.qwen3_5 import modeling_qwen3_5
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

from gdn_cp.layers import GatedDeltaNet, GatedDeltaNetConfig, seeded_layer
from gdn_cp.ops import recurrent_gated_delta_rule
from tests.gdn_cp.ops.helpers import assert_close_scaled

HIDDEN = 64
DECAY_PARAMETERS = ("A_log", "dt_bias", "in_proj_a.weight")
"""Parameters whose gradient comes only through the log-decay g."""


def _hf_config() -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
        hidden_size=HIDDEN,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=256,
        rms_norm_eps=1e-6,
    )


def _randomise(module: nn.Module, seed: int = 0) -> None:
    """Move every parameter off its initial value (norm.weight starts at ones, dt_bias at ones), so each one
    influences the output and its gradient is checked for real."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
            p.add_(0.2 * noise if name in ("norm.weight", "dt_bias", "A_log") else 0.1 * noise)


def _pair(chunk_size: int = 16) -> tuple[Qwen3_5GatedDeltaNet, GatedDeltaNet]:
    torch.manual_seed(0)  # transformers' layer initialises A_log from the global generator
    cfg = _hf_config()
    ref = Qwen3_5GatedDeltaNet(cfg, layer_idx=0)
    _randomise(ref)
    ours = GatedDeltaNet(GatedDeltaNetConfig.from_hf_config(cfg, chunk_size=chunk_size))
    ours.load_state_dict(ref.state_dict(), strict=True)
    return ref, ours


def _terms(T: int) -> int:
    """Accumulation length of one output: the core's T tokens of K-long dot products, each fed by HIDDEN-long
    projections (their product bounds the sum of the stages' lengths)."""
    return T * HIDDEN


def _hidden(B: int, T: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(B, T, HIDDEN, generator=torch.Generator().manual_seed(1)).to(dtype)


def test_parameter_names_and_shapes_match_transformers() -> None:
    ref, ours = _pair()
    assert {n: p.shape for n, p in ours.named_parameters()} == {n: p.shape for n, p in ref.named_parameters()}
    assert set(ours.state_dict()) == set(ref.state_dict())


def test_our_state_dict_loads_into_transformers(tmp_path: Path) -> None:
    _, ours = _pair()
    _randomise(ours, seed=3)
    torch.save(ours.state_dict(), tmp_path / "gdn.pt")
    torch.manual_seed(5)
    ref = Qwen3_5GatedDeltaNet(_hf_config(), layer_idx=0)
    ref.load_state_dict(torch.load(tmp_path / "gdn.pt", weights_only=True), strict=True)
    x = _hidden(1, 21)
    with torch.no_grad():
        assert_close_scaled(ours(x), ref(x), torch.float32, terms=_terms(x.shape[1]))


@pytest.mark.parametrize(
    "B, T, chunk_size",
    [
        pytest.param(2, 37, 16, id="B2-T37-C16"),
        pytest.param(1, 70, 64, id="B1-T70-C64"),
        pytest.param(1, 5, 16, id="B1-T5-C16"),
    ],
)
def test_forward_and_gradients_match_transformers(
    B: int, T: int, chunk_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward: ours == transformers' layer, both in fp32 (transformers computes its GDN core in fp32 even
    for an fp64 module). Gradients: ours in fp32 == transformers' layer in fp64 with its core replaced by
    the defining token-by-token recurrence, run in fp64: the gradient of an fp32 chunked core is not an
    fp32-accurate reference (the decay gradient sums products that cancel; transformers' fp32 d dt_bias is
    off by ~1e-2 of its scale in B1-T5-C16, ours by ~1e-5), so ours is held to the exact gradient instead.
    """
    ref, ours = _pair(chunk_size)
    x = _hidden(B, T).requires_grad_()
    r = torch.randn(B, T, HIDDEN, generator=torch.Generator().manual_seed(2))
    y_ref, y = ref(x), ours(x)
    assert_close_scaled(y, y_ref, torch.float32, terms=_terms(T))

    def exact_core(q, k, v, g, beta, chunk_size=64, initial_state=None, output_final_state=False, **kw):
        kw.pop("cu_seqlens", None)
        return recurrent_gated_delta_rule(
            q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state, **kw
        )

    monkeypatch.setattr(modeling_qwen3_5, "torch_chunk_gated_delta_rule", exact_core)
    exact = copy.deepcopy(ref).double()
    names = [n for n, _ in exact.named_parameters()]
    x64 = x.detach().double().requires_grad_()
    grads_exact = torch.autograd.grad((exact(x64) * r.double()).sum(), (x64, *exact.parameters()))
    params = dict(ours.named_parameters())
    grads = torch.autograd.grad((y * r).sum(), (x, *(params[n] for n in names)))
    c = ours.config
    # The decay's gradient (reaching DECAY_PARAMETERS) sums, for every token, over the pairs of its chunk and
    # the K x V state: C (C (K + V) + K V) products per token, whose signs cancel.
    decay_terms = chunk_size * (chunk_size * (c.head_k_dim + c.head_v_dim) + c.head_k_dim * c.head_v_dim)
    for name, a, b in zip(["input", *names], grads, grads_exact, strict=True):
        assert b.abs().max().item() > 0, f"{name}: zero gradient, the comparison would be vacuous"
        # Parameter gradients also sum over the B sequences of the batch.
        terms = B * _terms(T) * (decay_terms if name in DECAY_PARAMETERS else 1)
        assert_close_scaled(a, b, torch.float32, terms=terms, check_dtype=False, msg=f"d{name}:")


def test_bf16_layer_runs_and_is_close_to_fp32() -> None:
    _, ours = _pair()
    ours_bf16 = GatedDeltaNet(dataclasses.replace(ours.config, dtype="bf16"))
    ours_bf16.load_state_dict(ours.state_dict())  # copies cast to the bf16 parameters
    assert all(p.dtype == torch.bfloat16 for p in ours_bf16.parameters())
    x = _hidden(2, 37)
    with torch.no_grad():
        y = ours_bf16(x.bfloat16())
        y_ref = ours(x)
    assert y.dtype == torch.bfloat16 and y.shape == y_ref.shape
    # bf16 rounds on the way through the layer: the input, the weights and outputs of in_proj, conv and
    # out_proj, the core's and the norm's outputs: 9 roundings of at most eps/2 each, adding up like a random
    # walk (factor 2: twice eps/2 per rounding, for the conditioning of the q/k and output norms).
    assert_close_scaled(y, y_ref, torch.bfloat16, terms=9, factor=2, check_dtype=False, msg="bf16 layer:")


class _RandomDraws(TorchDispatchMode):
    """Records the device of every tensor a random initialiser fills."""

    RANDOM = frozenset(
        {torch.ops.aten.uniform_.default, torch.ops.aten.normal_.default, torch.ops.aten.bernoulli_.float}
    )

    def __init__(self) -> None:
        super().__init__()
        self.devices: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.RANDOM:
            self.devices.add(args[0].device.type)
        return func(*args, **(kwargs or {}))


def test_seeded_weights_are_drawn_on_the_cpu_whatever_the_device() -> None:
    """Issue 20: weights drawn on a device depend on its RNG; seeded_layer draws them on the CPU and moves
    them, so a rank on a GPU, one on an NPU and a CPU reference hold the same layer ("meta" stands in for a
    device here: every draw must still happen on the CPU)."""
    config = GatedDeltaNetConfig.from_hf_config(_hf_config())
    with _RandomDraws() as draws:
        layer = seeded_layer(config, 7, "meta")
    assert draws.devices == {"cpu"}
    assert {p.device.type for p in layer.parameters()} == {"meta"}
    a, b, c = seeded_layer(config, 7), seeded_layer(config, 7), seeded_layer(config, 8)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert not torch.equal(a.A_log, c.A_log)
    state = torch.random.get_rng_state()
    seeded_layer(config, 7)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is left alone


@pytest.mark.parametrize("T", [11, 2], ids=["T11", "T2-shorter-than-the-kernel"])
def test_prefill_states_are_transformers_cache_and_decode_continues_it(T: int) -> None:
    """prefill's GDNState is what transformers' layer leaves in its cache (conv states [B, D, W], zero-padded
    for a prompt shorter than W, copied bit for bit; the recurrent state [B, Hv, K, V]), and a decode step
    from it gives transformers' cached decode step."""
    ref, ours = _pair()
    config = _hf_config()
    config.layer_types = ["linear_attention"] * config.num_hidden_layers
    cache = DynamicCache(config=config)
    x, step = _hidden(2, T + 1).split([T, 1], dim=1)
    with torch.inference_mode():
        y_ref = ref(x, cache=cache)
        conv_ref = cache.get_conv_state(0, state_idx=0).clone()
        recurrent_ref = cache.get_recurrent_state(0, state_idx=0).clone()
        y, state = ours.prefill(x)
        next_ref, next_y = ref(step, cache=cache), ours.decode(step, state)[0]
    assert_close_scaled(y, y_ref, torch.float32, terms=_terms(T))
    assert torch.equal(state.conv_state, conv_ref)
    assert_close_scaled(state.recurrent_state, recurrent_ref, torch.float32, terms=_terms(T))
    assert_close_scaled(next_y, next_ref, torch.float32, terms=_terms(T + 1))


def test_prefill_then_decode_equals_the_forward_of_the_longer_sequence() -> None:
    """fp64: prefill of T tokens, then decode one token and then two, gives the forward of T + 3 tokens, and
    the state after them is the prefill's of T + 3; a packed prefill's states are each document's own."""
    _, ours = _pair()
    layer = ours.double()
    x = _hidden(2, 13, torch.float64)
    full, full_state = layer.prefill(x)
    y, state = layer.prefill(x[:, :10])
    y1, state = layer.decode(x[:, 10:11], state)
    y2, state = layer.decode(x[:, 11:], state)
    assert_close_scaled(torch.cat([y, y1, y2], dim=1), full, torch.float64, terms=_terms(13))
    for got, want in zip(state, full_state, strict=True):
        assert_close_scaled(got, want, torch.float64, terms=_terms(13))
    documents = [0, 1, 6, 13]  # a one-token document: its conv state is three zeros and its token
    _, packed = layer.prefill(x[:1], torch.tensor(documents))
    for d, (a, b) in enumerate(pairwise(documents)):
        _, alone = layer.prefill(x[:1, a:b])
        # the projections of 13 tokens and of one document's round differently: close, not equal
        assert_close_scaled(packed.conv_state[d], alone.conv_state[0], torch.float64, terms=HIDDEN)
        want = alone.recurrent_state[0]
        assert_close_scaled(packed.recurrent_state[d], want, torch.float64, terms=_terms(b - a))
    with pytest.raises(ValueError, match="hidden_states holds 1 sequences but the state 3"):
        layer.decode(x[:1, :1], packed)
