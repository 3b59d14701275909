"""Workloads whose n-gram speculation real vLLM answers differently, for the simulator to follow.

Why these three: n-gram (prompt lookup) drafts only where the text repeats, so its gain is a
property of the text, not of the server flags. Random-token prompts (what `vllm bench serve
--dataset-name random` sends) hold no repeats; natural prose holds a few; a looping prompt makes
even a model with random weights copy it. Each is sent greedy (temperature 0: real\nvLLM's counters are then a pure function of the prompts) and some also sampled (temperature 1),\nevery output the same length (`ignore_eos`).
"""

from __future__ import annotations

import random

#: The n-gram settings every workload is measured under (vLLM's spelling).
NGRAM_FLAGS = ["--spec-method", "ngram", "--spec-tokens", "3",
               "--speculative-config.prompt_lookup_max", "4",
               "--speculative-config.prompt_lookup_min", "2"]
MAX_TOKENS = 64
PROMPTS_PER_WORKLOAD = 8

NATURAL = [
    "The river runs past the old mill before it turns east toward the town, where the bridge was "
    "rebuilt after the flood. Children fish from the bank in summer, and in winter the ice is thick "
    "enough to walk on near the reeds.",
    "To bake bread you need flour, water, salt and yeast. Mix them, knead the dough for ten minutes, "
    "let it rise until it doubles, shape it, let it rise again and bake it in a hot oven.",
    "Our meeting on Tuesday covered the budget for next year, the hiring plan for the support team "
    "and the move to the new office. Please send your comments on the draft before Friday.",
    "Light from the sun takes about eight minutes to reach the earth. The moon reflects that light, "
    "which is why we see its phases change as it moves around us over a month.",
    "She opened the letter slowly, read the first line twice, and then sat down by the window. "
    "Outside, the rain had stopped and the street lamps were coming on one by one.",
    "A good password is long, hard to guess and used for one account only. A password manager can "
    "remember them for you, so you only have to remember one strong phrase.",
    "The train to the coast leaves at seven in the morning and stops at every small station on the "
    "way. Most people get off at the harbour, where the ferries to the islands wait.",
    "When the engine is cold, let it run for a minute before you drive off, and keep the speed low "
    "for the first few miles so the oil can reach every part.",
]

_LOOP_UNITS = [
    "one two three four five ", "the cat sat on the mat and ", "red green blue ", "a b c d e f g ",
    "up and down and ", "north south east west ", "tick tock ", "alpha beta gamma delta ",
]


def random_token_prompts(vocab_size: int, decode, n: int = PROMPTS_PER_WORKLOAD, length: int = 96,
                         seed: int = 0) -> list[str]:
    """Like `vllm bench serve`'s random dataset: uniformly random token ids, decoded to text."""
    rng = random.Random(seed)
    return [decode([rng.randrange(3, vocab_size) for _ in range(length)]) for _ in range(n)]


def loop_prompts(n: int = PROMPTS_PER_WORKLOAD) -> list[str]:
    """A short phrase said over and over: even a random-weight model copies the cycle."""
    return [(_LOOP_UNITS[i % len(_LOOP_UNITS)] * 12).strip() for i in range(n)]


def workloads(vocab_size: int, decode) -> dict[str, tuple[list[str], float]]:
    """name -> (prompts, temperature). Sampled at temperature 1 is what `vllm bench serve` sends
    by default now (it leaves the temperature to the server)."""
    random_tokens = random_token_prompts(vocab_size, decode)
    return {"random_tokens_t1": (random_tokens, 1.0),
            "natural_t1": (NATURAL[:PROMPTS_PER_WORKLOAD], 1.0),
            "random_tokens_t0": (random_tokens, 0.0),
            "natural_t0": (NATURAL[:PROMPTS_PER_WORKLOAD], 0.0),
            "loop_t0": (loop_prompts(), 0.0)}
