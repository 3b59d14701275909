"""Model profiles: the shape figures the physics needs (layers, heads, bytes of weights).

A profile comes either from a named entry of models.toml (public config.json shapes, written down so the
roofline works without downloading anything) or from a model directory: config.json for the shape
and the safetensors HEADERS for exact stored bytes (dtype x shape per tensor; weights are never
loaded, so a 50 GB checkpoint is profiled in milliseconds).
"""

from __future__ import annotations

from typing import Any

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from truthput.errors import InputError


@dataclass(frozen=True)
class ModelProfile:
    """Shape and stored size of one model. attn_layers counts full-attention layers only:
    linear-attention (Gated DeltaNet / Mamba) layers keep a constant-size state, not a KV cache."""

    name: str
    params: float
    active_params: float
    layers: int
    attn_layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    bits_per_weight: float
    weight_bytes: float
    mtp_params: float
    max_position_embeddings: int
    source: str
    tied_embeddings: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dense_param_count(
    layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
    vocab: int, tied_embeddings: bool = False,
) -> float:
    """Parameters of a llama-style dense decoder (GQA attention + SwiGLU MLP + norms)."""
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * intermediate
    per_layer = attn + mlp + 2 * hidden
    embeddings = vocab * hidden * (1 if tied_embeddings else 2)
    return float(layers * per_layer + embeddings + hidden)


def _named(name: str, *, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int,
           head_dim: int, vocab: int, max_pos: int, bits: float = 16.0, attn_layers: int | None = None,
           params: float | None = None, weight_bytes: float | None = None, mtp_params: float = 0.0,
           tied: bool = False, note: str) -> ModelProfile:
    if params is None:
        params = dense_param_count(layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, tied)
    if weight_bytes is None:
        weight_bytes = params * bits / 8
    return ModelProfile(
        name=name, params=params, active_params=params, layers=layers,
        attn_layers=layers if attn_layers is None else attn_layers, hidden=hidden,
        intermediate=intermediate, heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab,
        bits_per_weight=bits, weight_bytes=weight_bytes, mtp_params=float(mtp_params),
        max_position_embeddings=max_pos, source=f"named profile: {note}", tied_embeddings=tied,
    )


def _load_named() -> dict[str, ModelProfile]:
    """The named profiles of models.toml (beside this file)."""
    import tomllib

    with Path(__file__).with_name("models.toml").open("rb") as fh:
        entries = tomllib.load(fh)["model"]
    return {e["name"]: _named(**e) for e in entries}


_NAMED: dict[str, ModelProfile] = _load_named()

_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
    "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}


def list_models() -> list[ModelProfile]:
    """The named profiles."""
    return list(_NAMED.values())


def get_model(name_or_path: str) -> ModelProfile:
    """A named profile, or a directory holding config.json (+ *.safetensors headers)."""
    key = name_or_path.strip().lower()
    if key in _NAMED:
        return _NAMED[key]
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return _from_directory(path)
    known = ", ".join(_NAMED)
    raise InputError(
        f"unknown model {name_or_path!r}: not a named profile ({known}) and not a directory with config.json"
    )


def _read_safetensors_headers(directory: Path) -> tuple[float, float, float]:
    """(stored bytes, element count, MTP element count) over every *.safetensors file, from headers only."""
    from safetensors import safe_open

    total_bytes = 0.0
    total_elems = 0.0
    mtp_elems = 0.0
    for file in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="numpy") as handle:
                for name in handle.keys():
                    tensor = handle.get_slice(name)
                    dtype = tensor.get_dtype()
                    elems = float(math.prod(tensor.get_shape()))
                    if dtype not in _DTYPE_BYTES:
                        raise InputError(f"{file}: tensor {name!r} has unknown dtype {dtype}")
                    total_bytes += elems * _DTYPE_BYTES[dtype]
                    total_elems += elems
                    if "mtp" in name or "nextn" in name:
                        mtp_elems += elems
        except InputError:
            raise
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise InputError(f"{file}: cannot read safetensors header ({exc})") from exc
    return total_bytes, total_elems, mtp_elems


def _quant_bits(config: dict[str, Any]) -> float | None:
    """Bits per weight declared by a quantization_config (GPTQ/AWQ 'bits', compressed-tensors num_bits)."""
    q = config.get("quantization_config") or config.get("compression_config")
    if not q:
        return None
    if "bits" in q:
        return float(q["bits"])
    for group in (q.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        if "num_bits" in weights:
            return float(weights["num_bits"])
    return None


def _from_directory(directory: Path) -> ModelProfile:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise InputError(f"{directory}: no config.json (a model directory needs one)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{config_path}: cannot parse ({exc})") from exc
    text = config.get("text_config") or config  # multimodal configs nest the LM under text_config
    try:
        layers = int(text["num_hidden_layers"])
        hidden = int(text["hidden_size"])
        heads = int(text["num_attention_heads"])
        intermediate = int(text.get("intermediate_size") or 4 * hidden)
        vocab = int(text.get("vocab_size") or config["vocab_size"])
    except KeyError as exc:
        raise InputError(f"{config_path}: missing key {exc.args[0]!r}") from None
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    layer_types = text.get("layer_types")
    if layer_types:
        attn_layers = sum(1 for t in layer_types if t in ("full_attention", "attention"))
    elif text.get("full_attention_interval"):
        attn_layers = layers // int(text["full_attention_interval"])
    else:
        attn_layers = layers
    max_pos = int(text.get("max_position_embeddings") or 0)

    stored_bytes, elems, mtp_elems = _read_safetensors_headers(directory)
    analytic = dense_param_count(layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, tied)
    bits = _quant_bits(config)
    if bits is None and elems > 0:
        params = elems - mtp_elems
        bits = stored_bytes * 8 / elems
    else:
        # packed quantized tensors hide the element count: take the count from the shape
        params = analytic
        bits = bits if bits is not None else 16.0
    if stored_bytes == 0:
        stored_bytes = params * bits / 8
        origin = f"config.json (no safetensors; bytes from {bits:g} bits/weight): {directory}"
    else:
        origin = f"config.json + safetensors headers: {directory}"
    if text.get("num_experts") and text.get("num_experts_per_tok"):
        experts, active = int(text["num_experts"]), int(text["num_experts_per_tok"])
        expert_inter = int(text.get("moe_intermediate_size") or intermediate)
        expert_params = layers * experts * 3 * hidden * expert_inter
        active_params = max(params - expert_params * (experts - active) / experts, 0.0)
    else:
        active_params = params
    mtp_layers = int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0)
    mtp_params = mtp_elems if mtp_elems else float(mtp_layers) * (analytic - vocab * hidden * 2) / layers
    return ModelProfile(
        name=str(config.get("_name_or_path") or directory.name), params=params,
        active_params=active_params, layers=layers, attn_layers=attn_layers, hidden=hidden,
        intermediate=intermediate, heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab,
        bits_per_weight=bits, weight_bytes=stored_bytes, mtp_params=mtp_params,
        max_position_embeddings=max_pos, source=origin, tied_embeddings=tied,
    )
