"""Which server settings change what the prefix cache can hold or whether it caches at all: a
variant that changes one of them may change the cache's hit rate as part of its effect
(`analyze.summary`'s `cache_state_differs` names them), where any other difference in hit rate
between two arms is a doubt about the comparison. Each engine's own spelling, short forms too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CACHE_FLAGS = frozenset({
    # vLLM: the KV cache's size (memory share, dtype, offload, parallelism, weights) and caching itself
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--kv-cache-dtype", "--gpu-memory-utilization",
    "--max-model-len", "--block-size", "--num-gpu-blocks-override", "--kv-cache-memory-bytes", "--kv-cache-memory",
    "--swap-space", "--cpu-offload-gb", "--prefix-caching-hash-algo", "--kv-offloading-size",
    "--kv-offloading-backend", "--kv-transfer-config", "--tensor-parallel-size", "-tp", "--pipeline-parallel-size",
    "-pp", "--quantization", "-q",
    # llama.cpp: slots and their context, cache types, reuse and the host-RAM prompt cache
    "--cache-reuse", "--parallel", "-np", "--ctx-size", "-c", "--cache-type-k", "-ctk", "--cache-type-v", "-ctv",
    "--no-kv-offload", "-nkvo", "--swa-full", "--cache-ram", "-cram", "--kv-unified", "-kvu", "--no-kv-unified",
    "--slot-prompt-similarity", "-sps", "--no-cache-prompt", "--keep",
    # SGLang
    "--mem-fraction-static", "--disable-radix-cache", "--max-total-tokens", "--page-size",
})
CACHE_ENV = frozenset({"VLLM_CPU_KVCACHE_SPACE"})
"""Environment variables that size the KV cache (vLLM's CPU backend)."""


def cache_changes(diff: Mapping[str, Any], env: Mapping[str, str], base_env: Mapping[str, str]) -> list[str]:
    """The cache-related settings a variant changes against the baseline (`ArgvDiff.to_dict()`'s
    added / changed / removed, and the two environments), in the order the diff names them."""
    names = [str(row[0]) for part in ("added", "changed", "removed") for row in diff.get(part) or [] if row]
    out = [n for n in names if n in CACHE_FLAGS]
    out += [f"{k} (env)" for k in sorted(CACHE_ENV) if env.get(k) != base_env.get(k)]
    return list(dict.fromkeys(out))
