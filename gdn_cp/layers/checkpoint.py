"""A GatedDeltaNet layer's weights out of a Qwen3.5 checkpoint: an in-memory state_dict, or a folder (or
file) of safetensors as transformers' `save_pretrained` writes it.

    layer.load_state_dict(load_linear_attn_state_dict("Qwen3.5-checkpoint/", layer_idx=0, dtype="bf16"))

A checkpoint is either one `model.safetensors` or shards listed by `model.safetensors.index.json`, whose
`weight_map` maps every tensor name to the shard file holding it. Shards are opened lazily with
`safetensors.safe_open`, and only the requested layer's tensors are read: a layer whose tensors live in one
shard never opens the others (nor needs them on disk).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from gdn_cp.dtypes import to_dtype

SINGLE_FILE = "model.safetensors"
"""The one file of an unsharded checkpoint."""
INDEX_FILE = "model.safetensors.index.json"
"""The index of a sharded checkpoint: {"weight_map": {tensor name: shard file name, ...}, ...}."""

_ANY_LINEAR_ATTN = re.compile(r"(?:^|\.)layers\.(\d+)\.linear_attn\.")


def linear_attn_keys(
    keys: Iterable[str], layer_idx: int, *, source: str = "the state_dict"
) -> dict[str, str]:
    """GatedDeltaNet parameter name -> checkpoint key, for the `linear_attn` tensors of layer `layer_idx`.

    A key matches when it contains `layers.<layer_idx>.linear_attn.` at its start or after a `.`, so any
    prefix works (Qwen3_5ForCausalLM: `model.layers...`; the multimodal Qwen3_5ForConditionalGeneration:
    `model.language_model.layers...`) and `xlayers.0...` does not. KeyError naming `source` when nothing
    matches: the layer is not a linear-attention one (the message lists those there are), or no key looks
    like a Qwen3.5 layer at all.
    """
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
        raise ValueError(f"layer_idx must be a non-negative integer (a decoder layer), got {layer_idx!r}")
    keys = list(keys)
    marker = f"layers.{layer_idx}.linear_attn."
    found = {
        key.split(marker, 1)[1]: key
        for key in keys
        if marker in key and (key.startswith(marker) or key.split(marker, 1)[0].endswith("."))
    }
    if found:
        return found
    linear_layers = sorted({int(m.group(1)) for key in keys if (m := _ANY_LINEAR_ATTN.search(key))})
    if not linear_layers:
        sample = ", ".join(repr(k) for k in keys[:3]) or "none"
        raise KeyError(
            f"{source} is not a Qwen3.5 checkpoint: no key contains 'layers.<i>.linear_attn.' (as in "
            f"'model.layers.0.linear_attn.A_log'); its first keys: {sample}"
        )
    raise KeyError(
        f"{source}: no keys containing {marker!r}: layer {layer_idx} is not a linear-attention layer of this "
        f"checkpoint (see its config's layer_types); its linear-attention layers: "
        f"{', '.join(map(str, linear_layers))}"
    )


def linear_attn_state_dict(
    model_state_dict: Mapping[str, torch.Tensor], layer_idx: int
) -> dict[str, torch.Tensor]:
    """The `linear_attn` weights of decoder layer `layer_idx` from a whole Qwen3.5 state_dict, keyed as
    GatedDeltaNet's parameters (the tensors themselves, not copies). Keys match as `linear_attn_keys`.

    From a checkpoint on disk, `load_linear_attn_state_dict` reads only that layer's tensors.
    """
    return {
        name: model_state_dict[key] for name, key in linear_attn_keys(model_state_dict, layer_idx).items()
    }


def load_linear_attn_state_dict(
    path: str | os.PathLike[str],
    layer_idx: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
) -> dict[str, torch.Tensor]:
    """The `linear_attn` weights of decoder layer `layer_idx`, read from a safetensors checkpoint and keyed
    as GatedDeltaNet's parameters (e.g. `in_proj_qkv.weight` [2*Hk*K + Hv*V, hidden], `A_log` [Hv]).

    Args:
        path: a checkpoint folder (holding `model.safetensors.index.json` or `model.safetensors`), an index
            file, or one `.safetensors` file
        layer_idx: the decoder layer; it must be a linear-attention layer of the checkpoint
        device: where the tensors are read to (safetensors reads them there directly)
        dtype: cast to this dtype (a torch.dtype or a name such as "bf16"); None keeps the checkpoint's

    Raises FileNotFoundError for a missing path, index-named shard or checkpoint file; ValueError for an
    index without a weight_map, or a safetensors file that cannot be read (truncated, corrupted), naming
    it; KeyError when the layer is not a linear-attention layer of the checkpoint or the checkpoint is not
    a Qwen3.5 one.
    """
    target = None if dtype is None else to_dtype(dtype, "load_linear_attn_state_dict(dtype=...)")
    file, is_index = _resolve(Path(path))
    if not is_index:
        with _open(file, device) as f:
            hint = f" (for a sharded checkpoint pass its folder or {INDEX_FILE})"
            names = linear_attn_keys(f.keys(), layer_idx, source=f"{file}{hint}")
            return {name: _cast(f.get_tensor(key), target) for name, key in names.items()}

    index = file
    weight_map = _weight_map(index)
    names = linear_attn_keys(weight_map, layer_idx, source=str(index))
    by_shard: dict[str, list[tuple[str, str]]] = {}
    for name, key in names.items():
        by_shard.setdefault(weight_map[key], []).append((name, key))
    for shard, entries in by_shard.items():
        if not (index.parent / shard).is_file():
            raise FileNotFoundError(
                f"{index}: weight_map puts {entries[0][1]!r} in {shard!r}, which is not in {index.parent}: "
                "download that shard (or the whole checkpoint) again"
            )
    out: dict[str, torch.Tensor] = {}
    for shard, entries in by_shard.items():
        with _open(index.parent / shard, device) as f:
            for name, key in entries:
                out[name] = _cast(f.get_tensor(key), target)
    return {name: out[name] for name in names}  # in the index's order, whatever the shards' order


@contextmanager
def _open(file: Path, device: torch.device | str) -> Iterator[Any]:
    """safe_open(file), with any error safetensors raises reading it (a truncated or corrupted file, a bad
    header) as a ValueError that names the file."""
    try:
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            yield f
    except SafetensorError as exc:
        raise ValueError(
            f"{file}: not a readable safetensors file ({exc}); the download may be "
            "truncated or corrupted: download it again"
        ) from None


def _resolve(path: Path) -> tuple[Path, bool]:
    """(the file to read, whether it is an index) for a checkpoint folder or file."""
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint path {str(path)!r} does not exist: pass a checkpoint folder (with {INDEX_FILE} or "
            f"{SINGLE_FILE}), its index file, or a .safetensors file"
        )
    if path.is_dir():
        if (path / INDEX_FILE).is_file():
            return path / INDEX_FILE, True
        if (path / SINGLE_FILE).is_file():
            return path / SINGLE_FILE, False
        present = sorted(p.name for p in path.glob("*.safetensors*"))
        raise FileNotFoundError(
            f"{path} holds neither {INDEX_FILE} nor {SINGLE_FILE} (safetensors files there: "
            f"{', '.join(present) or 'none'}): pass the folder save_pretrained wrote, or one file itself"
        )
    if path.suffix in (".json", ".safetensors"):
        return path, path.suffix == ".json"
    raise ValueError(
        f"checkpoint path {str(path)!r} is neither a .safetensors file nor a safetensors index (.json): pass "
        "the checkpoint folder instead"
    )


def _weight_map(index: Path) -> dict[str, str]:
    """The tensor name -> shard file map of a safetensors index; ValueError naming the file otherwise."""
    try:
        data = json.loads(index.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{index} is not a safetensors index: not JSON ({exc})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(
            f"{index} is not a safetensors index: it needs a 'weight_map' object mapping each tensor name "
            f"to its shard file, as {INDEX_FILE} has"
        )
    return weight_map


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor if dtype is None else tensor.to(dtype)
