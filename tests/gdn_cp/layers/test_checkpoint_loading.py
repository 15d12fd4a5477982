"""Loading a layer's weights out of a whole Qwen3.5 model's state_dict (as a checkpoint holds them), and
out of a safetensors checkpoint on disk: one model.safetensors, or shards behind model.safetensors.index.json,
of which only the requested layer's tensors are read."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

from gdn_cp.layers import (
    GatedDeltaNet,
    GatedDeltaNetConfig,
    checkpoint,
    linear_attn_state_dict,
    load_linear_attn_state_dict,
)
from tests.gdn_cp.ops.helpers import assert_close_scaled


@pytest.fixture(scope="module")
def model() -> Qwen3_5ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3_5TextConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
    )
    return Qwen3_5ForCausalLM(config).eval()


@pytest.mark.parametrize("layer_idx", [0, 2])
def test_layer_from_whole_model_state_dict_matches_the_model_layer(model, layer_idx: int) -> None:
    state = model.state_dict()
    assert any(k.startswith(f"model.layers.{layer_idx}.linear_attn.") for k in state)
    ours = GatedDeltaNet(GatedDeltaNetConfig.from_hf_config(model.config, chunk_size=8))
    ours.load_state_dict(linear_attn_state_dict(state, layer_idx), strict=True)
    x = torch.randn(2, 19, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model.model.layers[layer_idx].linear_attn(x)
        # fp32; one output accumulates T tokens of the core, each fed by hidden_size-long projections.
        assert_close_scaled(ours(x), ref, torch.float32, terms=x.shape[1] * x.shape[2])


def test_prefixes_of_multimodal_checkpoints_work_and_similar_names_do_not_match(model) -> None:
    state = {f"model.language_model.{k.removeprefix('model.')}": v for k, v in model.state_dict().items()}
    state["model.xlayers.0.linear_attn.A_log"] = torch.zeros(4)  # "layers.0" inside another name
    assert (
        linear_attn_state_dict(state, 0).keys()
        == dict(GatedDeltaNet(GatedDeltaNetConfig.from_hf_config(model.config)).named_parameters()).keys()
    )


def test_a_full_attention_layer_is_refused_with_the_reason(model) -> None:
    with pytest.raises(KeyError, match="layer 3 is not a linear-attention layer"):
        linear_attn_state_dict(model.state_dict(), 3)


# --- from safetensors on disk -------------------------------------------------------------------------------

SHARD_1, SHARD_2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def _shard_of(key: str) -> str:
    """Layer 0 (and the embedding) in shard 1, layer 2 (and everything after it) in shard 2, and layer 1
    split: its input projections in shard 1, the rest in shard 2."""
    if key.startswith(("model.embed_tokens.", "model.layers.0.", "model.layers.1.linear_attn.in_proj")):
        return SHARD_1
    return SHARD_2


def _plain(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors save_file accepts: detached, contiguous, no storage shared between names."""
    return {k: v.detach().clone().contiguous() for k, v in state.items()}


@pytest.fixture(scope="module")
def state(model) -> dict[str, torch.Tensor]:
    return _plain(model.state_dict())


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, state) -> Path:
    """A checkpoint folder: two shards and the index that maps every tensor to its shard."""
    folder = tmp_path_factory.mktemp("sharded")
    weight_map = {key: _shard_of(key) for key in state}
    for shard in (SHARD_1, SHARD_2):
        save_file({k: v for k, v in state.items() if weight_map[k] == shard}, str(folder / shard))
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())}}
    (folder / checkpoint.INDEX_FILE).write_text(json.dumps({**index, "weight_map": weight_map}))
    return folder


@pytest.fixture(scope="module")
def single(tmp_path_factory, state) -> Path:
    folder = tmp_path_factory.mktemp("single")
    save_file(state, str(folder / checkpoint.SINGLE_FILE))
    return folder


class _Handle:
    """A safe_open handle that records the keys read through it."""

    def __init__(self, handle: Any, read: list[str]) -> None:
        self._handle, self._read = handle, read

    def __enter__(self) -> _Handle:
        self._handle.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.__exit__(*exc)

    def keys(self) -> list[str]:
        return list(self._handle.keys())

    def get_tensor(self, key: str) -> torch.Tensor:
        self._read.append(key)
        return self._handle.get_tensor(key)


@pytest.fixture
def reads(monkeypatch) -> dict[str, list[str]]:
    """The files the loader opens ("opened", by name) and the tensors it reads from them ("read")."""
    log: dict[str, list[str]] = {"opened": [], "read": []}

    def recording_safe_open(filename: str, framework: str, device: str = "cpu") -> _Handle:
        log["opened"].append(Path(filename).name)
        return _Handle(safe_open(filename, framework=framework, device=device), log["read"])

    monkeypatch.setattr(checkpoint, "safe_open", recording_safe_open)
    return log


def _assert_exactly(loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


@pytest.mark.parametrize(("layer_idx", "shards"), [(0, [SHARD_1]), (1, [SHARD_1, SHARD_2]), (2, [SHARD_2])])
def test_sharded_checkpoint_reads_only_the_layers_tensors(
    sharded, state, model, reads, layer_idx: int, shards: list[str]
) -> None:
    loaded = load_linear_attn_state_dict(sharded, layer_idx)
    _assert_exactly(loaded, linear_attn_state_dict(state, layer_idx))
    assert sorted(reads["opened"]) == shards  # a layer in one shard never opens the other
    assert sorted(reads["read"]) == sorted(
        k for k in state if k.startswith(f"model.layers.{layer_idx}.linear_attn.")
    )
    layer = GatedDeltaNet(GatedDeltaNetConfig.from_hf_config(model.config))
    layer.load_state_dict(loaded, strict=True)


def test_the_index_file_itself_and_a_single_file_checkpoint_load_the_same(
    sharded, single, state, reads
) -> None:
    expected = linear_attn_state_dict(state, 2)
    _assert_exactly(load_linear_attn_state_dict(sharded / checkpoint.INDEX_FILE, 2), expected)
    _assert_exactly(load_linear_attn_state_dict(single, 2), expected)
    _assert_exactly(load_linear_attn_state_dict(str(single / checkpoint.SINGLE_FILE), 2), expected)
    assert reads["opened"] == [SHARD_2, checkpoint.SINGLE_FILE, checkpoint.SINGLE_FILE]
    assert len(reads["read"]) == 3 * len(expected)  # the single file too: only the layer's tensors


def test_dtype_and_device(single, state) -> None:
    loaded = load_linear_attn_state_dict(single, 0, device=torch.device("cpu"), dtype="bf16")
    _assert_exactly(loaded, {k: v.to(torch.bfloat16) for k, v in linear_attn_state_dict(state, 0).items()})
    with pytest.raises(ValueError, match=r"load_linear_attn_state_dict\(dtype=...\): unknown dtype 'int3'"):
        load_linear_attn_state_dict(single, 0, dtype="int3")


def test_a_folder_save_pretrained_wrote(tmp_path, model, state) -> None:
    model.save_pretrained(tmp_path, max_shard_size="60KB")
    assert (tmp_path / checkpoint.INDEX_FILE).is_file() and len(list(tmp_path.glob("*.safetensors"))) > 1
    for layer_idx in (0, 1, 2):
        _assert_exactly(
            load_linear_attn_state_dict(tmp_path, layer_idx), linear_attn_state_dict(state, layer_idx)
        )


def _folder(path: Path, **texts: str) -> Path:
    """A new folder holding text files (name -> content)."""
    path.mkdir()
    for name, text in texts.items():
        (path / name).write_text(text)
    return path


def test_missing_and_unknown_paths_are_refused_with_what_to_pass(tmp_path, sharded) -> None:
    with pytest.raises(FileNotFoundError, match=r"checkpoint path '.*nowhere' does not exist"):
        load_linear_attn_state_dict(tmp_path / "nowhere", 0)
    with pytest.raises(
        FileNotFoundError, match=r"holds neither model.safetensors.index.json nor model.safetensors"
    ):
        load_linear_attn_state_dict(_folder(tmp_path / "empty"), 0)
    with pytest.raises(ValueError, match=r"neither a .safetensors file nor a safetensors index"):
        load_linear_attn_state_dict(_folder(tmp_path / "bin", **{"x.bin": ""}) / "x.bin", 0)
    with pytest.raises(ValueError, match=r"layer_idx must be a non-negative integer"):
        load_linear_attn_state_dict(sharded, -1)


def test_an_index_without_the_layer_names_the_linear_attention_layers(sharded) -> None:
    # The index names every layer, but the full-attention layer 3 has no linear_attn tensors.
    with pytest.raises(KeyError, match=r"layer 3 is not a linear-attention layer .* layers: 0, 1, 2"):
        load_linear_attn_state_dict(sharded, 3)


def test_a_missing_shard_is_named_only_when_the_layer_needs_it(tmp_path, sharded, state) -> None:
    # Only shard 1 downloaded: layer 0 still loads (shard 2 is never needed), layer 2 names what is missing.
    partial = _folder(
        tmp_path / "partial", **{checkpoint.INDEX_FILE: (sharded / checkpoint.INDEX_FILE).read_text()}
    )
    shutil.copy(sharded / SHARD_1, partial / SHARD_1)
    _assert_exactly(load_linear_attn_state_dict(partial, 0), linear_attn_state_dict(state, 0))
    with pytest.raises(
        FileNotFoundError, match=rf"weight_map puts 'model.layers.2.linear_attn.* in '{SHARD_2}'"
    ):
        load_linear_attn_state_dict(partial, 2)


def test_files_that_are_not_a_qwen35_checkpoint(tmp_path) -> None:
    no_map = _folder(tmp_path / "no_map", **{checkpoint.INDEX_FILE: '{"metadata": {}}'})
    with pytest.raises(ValueError, match=r"is not a safetensors index: it needs a 'weight_map' object"):
        load_linear_attn_state_dict(no_map, 0)
    not_json = _folder(tmp_path / "not_json", **{checkpoint.INDEX_FILE: "{"})
    with pytest.raises(ValueError, match=r"is not a safetensors index: not JSON"):
        load_linear_attn_state_dict(not_json, 0)
    other = _folder(tmp_path / "other")
    save_file(_plain(torch.nn.Linear(2, 2).state_dict()), str(other / checkpoint.SINGLE_FILE))
    with pytest.raises(
        KeyError, match=r"is not a Qwen3.5 checkpoint: no key contains 'layers.<i>.linear_attn.'"
    ):
        load_linear_attn_state_dict(other, 0)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "bad header length"])
def test_a_corrupted_safetensors_file_is_named(tmp_path, single, sharded, damage) -> None:
    """A download cut short or damaged: one ValueError naming the file, never safetensors' bare error."""
    for source in (single / checkpoint.SINGLE_FILE, sharded / SHARD_1):
        folder = tmp_path / f"{damage}-{source.parent.name}"
        shutil.copytree(source.parent, folder)
        broken = folder / source.name
        data = broken.read_bytes()
        broken.write_bytes(
            {
                "garbage": b"not a safetensors file at all",
                "truncated": data[: len(data) // 2],
                "bad header length": (1 << 40).to_bytes(8, "little") + data[8:],
            }[damage]
        )
        with pytest.raises(ValueError, match=rf"^{re.escape(str(broken))}: not a readable safetensors file"):
            load_linear_attn_state_dict(folder, 0)
