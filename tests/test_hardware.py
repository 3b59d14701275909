"""GPU catalog lookups and model profiles (named and from a directory's safetensors headers)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from truthput.errors import InputError
from truthput.hardware.gpus import get_gpu, list_gpus
from truthput.hardware.models import dense_param_count, get_model, list_models

REQUIRED_GPUS = ["RTX 3090", "RTX 4090", "L4", "L40S", "A10", "A100 40GB", "A100 80GB", "H100 SXM",
                 "H100 PCIe", "H200", "B200", "MI300X"]


@pytest.mark.parametrize("alias,name", [("RTX 3090", "RTX 3090"), ("rtx3090", "RTX 3090"),
                                        ("3090", "RTX 3090"), ("H100 SXM", "H100 SXM"),
                                        ("h100-sxm", "H100 SXM"), ("NVIDIA H100-SXM", "H100 SXM"),
                                        ("mi300x", "MI300X"), ("a100 80gb", "A100 80GB")])
def test_gpu_aliases(alias: str, name: str) -> None:
    assert get_gpu(alias).name == name


def test_unknown_gpu_lists_known_names() -> None:
    with pytest.raises(InputError) as info:
        get_gpu("GTX 480")
    message = str(info.value)
    assert "GTX 480" in message and "RTX 3090" in message and "\n" not in message


def test_catalog_is_complete_and_dense() -> None:
    names = {g.name for g in list_gpus()}
    assert set(REQUIRED_GPUS) <= names
    for gpu in list_gpus():
        assert gpu.sources and gpu.interconnect.source
        assert gpu.memory_bytes > 15 * 2**30 and gpu.mem_bw_Bps > 2e11
        if gpu.fp8_flops:  # dense fp8 is 2x dense bf16 on every listed part: no sparsity figures
            assert gpu.fp8_flops == pytest.approx(2 * gpu.bf16_flops, rel=0.02)
    h100 = get_gpu("H100 SXM")
    assert h100.bf16_flops == pytest.approx(989.4e12) and h100.mem_bw_Bps == 3.35e12
    rtx = get_gpu("RTX 3090")
    assert rtx.mem_bw_Bps == 936e9 and rtx.memory_bytes == 24 * 2**30 and rtx.fp8_flops is None
    # consumer cards in the seed: PCIe without P2P, latency in the tens of microseconds
    assert rtx.interconnect.kind == "pcie" and 10e-6 <= rtx.interconnect.latency_s <= 100e-6
    assert "estimate" in rtx.interconnect.source
    assert get_gpu("H100 SXM").interconnect.kind == "nvlink"


def test_named_models_match_public_parameter_counts() -> None:
    assert get_model("llama-3.1-8b").params == pytest.approx(8.03e9, rel=0.005)
    assert get_model("llama-3.1-70b").params == pytest.approx(70.55e9, rel=0.005)
    assert get_model("qwen2.5-32b").params == pytest.approx(32.76e9, rel=0.01)
    assert get_model("qwen2.5-7b").params == pytest.approx(7.62e9, rel=0.01)
    seed = get_model("qwen3.6-27b-5.5bit")
    assert seed.weight_bytes == pytest.approx(18.6e9) and seed.bits_per_weight == 5.5
    assert seed.attn_layers == 16 and seed.layers == 64 and seed.mtp_params > 0
    assert get_model("llama-3.1-8b").weight_bytes == pytest.approx(2 * get_model("llama-3.1-8b").params)
    assert all(m.source.startswith("named profile") for m in list_models())
    with pytest.raises(InputError, match="llama-3.1-8b"):
        get_model("no-such-model")


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """Write a safetensors file of zeros (format: u64 LE header size, JSON header, raw data)."""
    sizes = {"BF16": 2, "F32": 4, "I32": 4}
    header: dict = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))
    return offset


def make_tiny_llama(directory: Path, layers: int = 2, hidden: int = 128, heads: int = 4,
                    kv_heads: int = 2, vocab: int = 2048, intermediate: int = 256) -> int:
    """A tiny bf16 llama checkpoint (zeros), split over two shards; returns total data bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    head_dim = hidden // heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers,
              "hidden_size": hidden, "intermediate_size": intermediate, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": 4096,
              "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    (directory / "config.json").write_text(json.dumps(config))
    shard1 = {"model.embed_tokens.weight": ("BF16", [vocab, hidden])}
    shard2 = {"lm_head.weight": ("BF16", [vocab, hidden]), "model.norm.weight": ("BF16", [hidden])}
    for i in range(layers):
        p = f"model.layers.{i}."
        target = shard1 if i == 0 else shard2
        target.update({
            p + "self_attn.q_proj.weight": ("BF16", [heads * head_dim, hidden]),
            p + "self_attn.k_proj.weight": ("BF16", [kv_heads * head_dim, hidden]),
            p + "self_attn.v_proj.weight": ("BF16", [kv_heads * head_dim, hidden]),
            p + "self_attn.o_proj.weight": ("BF16", [hidden, heads * head_dim]),
            p + "mlp.gate_proj.weight": ("BF16", [intermediate, hidden]),
            p + "mlp.up_proj.weight": ("BF16", [intermediate, hidden]),
            p + "mlp.down_proj.weight": ("BF16", [hidden, intermediate]),
            p + "input_layernorm.weight": ("BF16", [hidden]),
            p + "post_attention_layernorm.weight": ("BF16", [hidden]),
        })
    total = _write_safetensors(directory / "model-00001-of-00002.safetensors", shard1)
    total += _write_safetensors(directory / "model-00002-of-00002.safetensors", shard2)
    return total


def test_tiny_llama_directory_profile(tmp_path: Path) -> None:
    data_bytes = make_tiny_llama(tmp_path / "tiny")
    model = get_model(str(tmp_path / "tiny"))
    expected_params = dense_param_count(2, 128, 256, 4, 2, 32, 2048)
    # hand count: embed+lm_head 2*2048*128 = 524288; per layer q,o 2*128*128 + k,v 2*64*128
    # + mlp 3*128*256 + norms 256 = 147712; two layers + final norm 128
    assert expected_params == 524288 + 2 * 147712 + 128
    assert model.params == expected_params
    assert model.weight_bytes == data_bytes == 2 * expected_params  # exact bf16 bytes from headers
    assert model.bits_per_weight == 16.0
    assert (model.layers, model.attn_layers, model.hidden, model.heads, model.kv_heads,
            model.head_dim, model.vocab) == (2, 2, 128, 4, 2, 32, 2048)
    assert model.source.startswith("config.json + safetensors headers:")


def test_hybrid_and_quantised_config(tmp_path: Path) -> None:
    d = tmp_path / "hybrid"
    d.mkdir()
    config = {"text_config": {"num_hidden_layers": 8, "hidden_size": 256, "intermediate_size": 512,
                              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
                              "vocab_size": 1000, "full_attention_interval": 4,
                              "max_position_embeddings": 8192, "mtp_num_hidden_layers": 1},
              "quantization_config": {"quant_method": "gptq", "bits": 4}}
    (d / "config.json").write_text(json.dumps(config))
    model = get_model(str(d))
    assert model.attn_layers == 2 and model.bits_per_weight == 4.0 and model.mtp_params > 0
    assert model.weight_bytes == pytest.approx(model.params * 4 / 8)


def test_bad_model_directory_errors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="config.json"):
        get_model(str(tmp_path))
