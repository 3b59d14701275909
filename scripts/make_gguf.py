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

It also writes a Llama-shaped model with random weights and a small byte-level vocabulary, with
nothing but numpy and gguf-py (the project's own .venv is enough: no torch, no model download). Its
outputs are noise, but every step of the server does the work of a real model of that shape, so its
throughput is that of such a model (greedy outputs, the output guard and speculation are not
meaningful on it). Sizes: tiny (~4M parameters: CPU tests), 1b (Llama-3.2-1B's shape), 3b.

Usage: <repo>/.venv-vllm/bin/python scripts/make_gguf.py MODEL_DIR OUT.gguf
       <repo>/.venv/bin/python scripts/make_gguf.py --random tiny|1b|3b OUT.gguf   (+ config.json beside it)
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


SHAPES = {  # hidden, layers, heads, kv heads, feed-forward, context
    "tiny": (256, 4, 4, 4, 768, 4096),
    "1b": (2048, 16, 32, 8, 8192, 8192),
    "3b": (3072, 28, 24, 8, 8192, 8192),
}


def _byte_vocab(gguf):  # type: ignore[no-untyped-def]
    """GPT-2's byte-level alphabet (256 tokens), letter pairs and " x" merged, two control tokens."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {b: chr(b) for b in visible}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    tokens = [chars[b] for b in range(256)]
    letters = "abcdefghijklmnopqrstuvwxyz"
    space = chars[ord(" ")]
    merges = [f"{space} {c}" for c in letters] + [f"{a} {b}" for a in letters for b in letters]
    tokens += [m.replace(" ", "") for m in merges] + ["<s>", "</s>"]
    types = [gguf.TokenType.NORMAL] * (len(tokens) - 2) + [gguf.TokenType.CONTROL] * 2
    return tokens, types, merges


def write_random(size: str, out: Path, seed: int = 0) -> int:
    """A Llama-shaped GGUF of `size` with random f16 weights; returns its parameter count."""
    import numpy as np

    gguf = _import_gguf()
    hidden, layers, heads, kv, ffn, ctx = SHAPES[size]
    tokens, types, merges = _byte_vocab(gguf)
    vocab = len(tokens)
    head_dim = hidden // heads
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(f"truthput-random-llama-{size}")
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab - 2)
    w.add_eos_token_id(vocab - 1)
    w.add_pad_token_id(vocab - 2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant: {% endif %}")
    rng = np.random.default_rng(seed)
    made: dict[tuple[int, int], object] = {}

    def mat(rows: int, cols: int):  # type: ignore[no-untyped-def]
        # one random matrix per shape, shared by every layer: the work per token is a real model's,
        # and a 3B file is written in seconds
        if (rows, cols) not in made:
            made[(rows, cols)] = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)
        return made[(rows, cols)]

    ones = np.ones(hidden, dtype=np.float32)
    w.add_tensor("token_embd.weight", mat(vocab, hidden))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("output.weight", mat(vocab, hidden))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(hidden, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(kv * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(kv * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(hidden, hidden))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # the shape as a config.json beside it, so `[model] path = "<this folder>"` gives the roofline its bytes
    (out.parent / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": ctx, "head_dim": head_dim,
        "tie_word_embeddings": False, "torch_dtype": "float16", "rms_norm_eps": 1e-5}, indent=1) + "\n")
    per_layer = 2 * hidden * hidden + 2 * kv * head_dim * hidden + 3 * ffn * hidden + 2 * hidden
    return 2 * vocab * hidden + hidden + layers * per_layer


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--random":
        size, out = sys.argv[2], Path(sys.argv[3])
        if size not in SHAPES:
            sys.exit(f"make_gguf: --random {size}: give one of {', '.join(SHAPES)}")
        out.parent.mkdir(parents=True, exist_ok=True)
        n = write_random(size, out)
        print(f"make_gguf: wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {n / 1e6:.1f}M parameters, "
              "random weights: for throughput only)")
        return
    if len(sys.argv) != 3:
        sys.exit("\n".join(__doc__.strip().splitlines()[-2:]))
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    if not (model_dir / "config.json").exists():
        sys.exit(f"make_gguf: {model_dir}: no config.json (make one with scripts/make_tiny_model.py)")
    out.parent.mkdir(parents=True, exist_ok=True)
    convert(model_dir, out)
    print(f"make_gguf: wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
