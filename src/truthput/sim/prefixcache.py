"""vLLM's automatic prefix caching, as the simulator models it: a prompt's full blocks hashed in a
chain (a block's hash covers every token before it), cached blocks shared by the requests that
hold them, and kept after their requests end until a new block needs the room (least recently
freed first). A hit skips the prefill of its blocks; at least the prompt's last token is computed.

The model's own token ids are hashed where the simulator has the tokenizer; without it, words
stand in for tokens (`ids_per_block` words a block, the workload's 0.75 words a token), so two
prompts that share text share blocks either way.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    def __init__(self, block_size: int, ids_per_block: int, enabled: bool = True) -> None:
        self.block_size = block_size
        self.ids_per_block = max(1, ids_per_block)
        self.enabled = enabled
        self.held: dict[int, int] = {}
        """Cached blocks some request holds: hash -> how many requests."""
        self.free: OrderedDict[int, None] = OrderedDict()
        """Cached blocks no request holds (counted among the engine's free blocks), oldest first."""

    def hashes(self, ids: Sequence[int]) -> list[int]:
        """The chained hashes of the prompt's full blocks."""
        out: list[int] = []
        h = 0
        n = self.ids_per_block
        for start in range(0, len(ids) - n + 1, n):
            h = hash((h, tuple(ids[start:start + n])))
            out.append(h)
        return out

    def cached(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Leading blocks of the prompt already cached (the prompt's last token is always computed)."""
        most = max(0, (prompt_tokens - 1) // self.block_size)
        n = 0
        for h in hashes[:most]:
            if h not in self.held and h not in self.free:
                break
            n += 1
        return n

    def take(self, hashes: Sequence[int]) -> int:
        """A request holds these cached blocks; how many of them were free (no longer free now)."""
        was_free = 0
        for h in hashes:
            if h in self.free:
                del self.free[h]
                was_free += 1
                self.held[h] = 1
            else:
                self.held[h] = self.held.get(h, 0) + 1
        return was_free

    def add(self, hashes: Sequence[int]) -> list[int]:
        """Blocks a request just computed become cached (held by it); those another request cached
        first stay that one's. Returns the hashes it now holds."""
        mine = [h for h in hashes if h not in self.held and h not in self.free]
        for h in mine:
            self.held[h] = 1
        return mine

    def release(self, hashes: Sequence[int]) -> int:
        """A request let go of its blocks: those no request holds stay cached, newest last. Returns
        how many blocks no request holds now (room the engine gets back)."""
        freed = 0
        for h in hashes:
            left = self.held.get(h, 0) - 1
            if left > 0:
                self.held[h] = left
            else:
                self.held.pop(h, None)
                self.free[h] = None
                freed += 1
        return freed

    def evict(self, n: int) -> None:
        """Forget the n least recently freed cached blocks (their room is taken)."""
        for _ in range(min(n, len(self.free))):
            self.free.popitem(last=False)

    def reset(self) -> bool:
        """Forget every cached block no request holds; False (nothing done) while some are held,
        as vLLM refuses a reset while requests run."""
        if self.held:
            return False
        self.free.clear()
        return True
