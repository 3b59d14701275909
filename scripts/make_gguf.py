#!/usr/bin/env python
"""Write a GGUF file (f16 weights) of a Llama model folder made by scripts/make_tiny_model.py, for
llama.cpp's `llama-server`.

Why not llama.cpp's own converter: `convert_hf_to_gguf.py` refuses a locally trained BPE tokenizer
("BPE pre-tokenizer was not recognized": it hashes how the tokenizer encodes a fixed string). Our
tokenizer is byte-level BPE with GPT-2's pre-tokenizer, so `tokenizer.ggml.pre = "gpt-2"` is right,
and the rest is what the converter does for a Llama: Q and K rows permuted for llama.cpp's RoPE
layout, norms in f32, matrices in f16, the vocabulary, merges and chat template carried over.

The `gguf` package comes from llama.cpp's own source tree (`gguf-py`, the one the installed
llama-server was built from; found through scripts/install-llama-cpp.sh's cache or GGUF_PY), or a
pip-installed `gguf`. Reading bf16 safetensors needs torch (present in .venv-vllm).

Usage: <repo>/.venv-vllm/bin/python scripts/make_gguf.py MODEL_DIR OUT.gguf
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _import_gguf():  # type: ignore[no-untyped-def]
    cache = Path(os.environ.get("TRUTHPUT_CACHE", Path.home() / ".cache" / "truthput"))
    for cand in (os.environ.get("GGUF_PY"), cache / "llama.cpp-b11434" / "src" / "gguf-py"):
        if cand and Path(cand, "gguf", "__init__.py").exists():
            sys.path.insert(0, str(cand))
            break
    try:
        import gguf
    except ImportError:
        sys.exit("make_gguf: the gguf package was not found (run scripts/install-llama-cpp.sh first, "
                 "or set GGUF_PY=<llama.cpp>/gguf-py, or pip install gguf)")
    return gguf


def _permute(w, n_head: int):  # type: ignore[no-untyped-def]
    """HF's rotary layout (halves) -> llama.cpp's (interleaved pairs), as convert_hf_to_gguf does."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert(model_dir: Path, out: Path) -> None:
    import numpy as np
    from safetensors.torch import load_file

    gguf = _import_gguf()
    cfg = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    rope = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta") or 10000.0

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(model_dir.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    vocab = tok["model"]["vocab"]
    added = {a["id"]: a["content"] for a in tok.get("added_tokens", [])}
    by_id = {i: t for t, i in vocab.items()}
    by_id.update(added)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(cfg["vocab_size"])]
    types = [gguf.TokenType.CONTROL if i in added else gguf.TokenType.NORMAL for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_bos_token_id(ids[tok_cfg["bos_token"]])
    w.add_eos_token_id(ids[tok_cfg["eos_token"]])
    w.add_pad_token_id(ids[tok_cfg.get("pad_token", tok_cfg["bos_token"])])
    w.add_add_bos_token(False)
    template = model_dir / "chat_template.jinja"
    if template.exists():
        w.add_chat_template(template.read_text())

    tensors = load_file(str(model_dir / "model.safetensors"))

    def arr(name: str, dtype):  # type: ignore[no-untyped-def]
        return tensors[name].float().numpy().astype(dtype)

    w.add_tensor("token_embd.weight", arr("model.embed_tokens.weight", np.float16))
    w.add_tensor("output_norm.weight", arr("model.norm.weight", np.float32))
    head = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
    w.add_tensor("output.weight", arr(head, np.float16))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", arr(p + "input_layernorm.weight", np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(arr(p + "self_attn.q_proj.weight", np.float16), n_head))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(arr(p + "self_attn.k_proj.weight", np.float16), n_kv))
        w.add_tensor(f"blk.{i}.attn_v.weight", arr(p + "self_attn.v_proj.weight", np.float16))
        w.add_tensor(f"blk.{i}.attn_output.weight", arr(p + "self_attn.o_proj.weight", np.float16))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", arr(p + "post_attention_layernorm.weight", np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", arr(p + "mlp.gate_proj.weight", np.float16))
        w.add_tensor(f"blk.{i}.ffn_up.weight", arr(p + "mlp.up_proj.weight", np.float16))
        w.add_tensor(f"blk.{i}.ffn_down.weight", arr(p + "mlp.down_proj.weight", np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    if not (model_dir / "config.json").exists():
        sys.exit(f"make_gguf: {model_dir}: no config.json (make one with scripts/make_tiny_model.py)")
    out.parent.mkdir(parents=True, exist_ok=True)
    convert(model_dir, out)
    print(f"make_gguf: wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
