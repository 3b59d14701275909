"""The simulated engine: vLLM-style continuous batching in real time, priced by the physics model.

One asyncio task runs engine steps back to back. A step (1) schedules: running decodes first
(1 + draft tokens each), then chunked prefill of running and newly admitted requests, all within
--max-num-batched-tokens, --max-num-seqs and the KV blocks free (running out of blocks preempts
the most recently admitted request, which is later recomputed); (2) asks the pricer how long that
step takes on the simulated hardware; (3) sleeps until the step's end on a drift-free clock
(t_end = t_start + sum of step times, not now + dt); (4) emits the step's tokens to the streams
and bumps the counters in the same event-loop turn.

Speculation: per sequence per step a draft of length d. MTP/EAGLE/draft models draft k tokens,
position i accepted with probability a_i only if all earlier were. n-gram drafts by prompt lookup
over the request's prompt + output and a draft token is accepted while it equals the token the
model emits there (sim/speculation.py), so it drafts only where the text repeats. The step emits
1 + accepted. Each request's first token comes from prefill (no draft). Accepted
tokens beyond a request's remaining length are not counted as accepted, so
emitted == drafts + accepted + steps-without-draft holds exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Callable, NamedTuple

from truthput.sim.logs import StatsLogger
from truthput.sim.metrics import SimMetrics
from truthput.sim.prefixcache import PrefixCache
from truthput.sim.speculation import DEFAULT_LOOKUP, NgramProposer, accepted_prefix
from truthput.sim.textgen import TokenStream

#: Default per-position conditional acceptance by method family (last value repeats).
DEFAULT_ACCEPTANCE: dict[str, tuple[float, ...]] = {
    "mtp": (0.85, 0.7, 0.6, 0.5, 0.45),
    "eagle": (0.75, 0.6, 0.5, 0.4, 0.35),
    "draft_model": (0.7, 0.55, 0.45, 0.4, 0.35),
    "ngram": (0.6, 0.5, 0.4, 0.35, 0.3),
}


def method_family(method: str | None) -> str | None:
    """Map vLLM method names (qwen3_5_mtp, deepseek_mtp, eagle3, ...) to a family."""
    if not method:
        return None
    m = method.lower()
    if "mtp" in m:
        return "mtp"
    if "eagle" in m or "medusa" in m or "mlp_speculator" in m:
        return "eagle"
    if "ngram" in m or "prompt_lookup" in m or "suffix" in m:
        return "ngram"
    return "draft_model"


class StepShape(NamedTuple):
    """What one engine step computes: the input of the pricer. A named tuple: built once per
    step, and the pricer's cache key as it is."""

    decode_seqs: int
    context_tokens: int
    spec_k: int
    prefill_tokens: int
    prefill_seqs: int
    draft_tokens: int | None = None
    """The draft tokens the step verifies (n-gram drafts only where the text repeats, often fewer
    than k); None: spec_k for every decoding sequence."""


StepPricer = Callable[[StepShape], float]


class SimRequest:
    """One request's state; the HTTP handler waits on it for emitted tokens."""

    __slots__ = ("rid", "prompt_tokens", "max_new", "end_reason", "stream", "emitted", "computed",
                 "prefill_target", "blocks", "arrival", "first_token_time", "last_token_time",
                 "finish_reason", "waiter", "prompt_counted", "admit_seq", "admit_time", "proposer", "draft",
                 "prefix_ids", "block_hashes", "cached_blocks", "held", "cache_hit_tokens")

    def __init__(self, rid: str, prompt_tokens: int, max_new: int, end_reason: str,
                 stream: TokenStream, arrival: float,
                 prefix_ids: Callable[[], Sequence[int]] | None = None) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.max_new = max_new
        self.end_reason = end_reason  # finish_reason once max_new tokens are out
        self.stream = stream
        self.emitted = 0
        self.computed = 0
        self.prefill_target = prompt_tokens
        self.blocks = 0
        self.arrival = arrival
        self.first_token_time: float | None = None
        self.last_token_time = arrival
        self.finish_reason: str | None = None
        self.waiter: asyncio.Future | None = None
        self.prompt_counted = False
        self.admit_seq = 0
        self.admit_time: float | None = None
        self.proposer: NgramProposer | None = None
        self.draft: list[int] = []
        self.prefix_ids = prefix_ids
        """The prompt's ids for the prefix cache's hashes (None: a prompt no other shares)."""
        self.block_hashes: list[int] | None = None
        self.cached_blocks = 0
        """Prompt blocks the last admission found in the prefix cache."""
        self.held: list[int] = []
        """Hashes of the cached blocks this request holds."""
        self.cache_hit_tokens = 0

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Return once there are tokens beyond `seen` or the request finished."""
        self.waiter = asyncio.get_running_loop().create_future()
        await self.waiter
        self.waiter = None


@dataclass
class EngineLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    kv_capacity_tokens: int


class SimEngine:
    """Continuous-batching engine loop; see the module docstring."""

    def __init__(self, limits: EngineLimits, pricer: StepPricer, metrics: SimMetrics,
                 stats_logger: StatsLogger | None, *, spec_k: int = 0, spec_method: str | None = None,
                 acceptance: list[float] | None = None, seed: int = 0, jitter: float = 0.0,
                 lookup: tuple[int, int] = DEFAULT_LOOKUP, cache: PrefixCache | None = None) -> None:
        self.limits = limits
        self.pricer = pricer
        self.metrics = metrics
        self.stats_logger = stats_logger
        self.spec_k = spec_k
        self.family = method_family(spec_method) if spec_k > 0 else None
        acc = acceptance or list(DEFAULT_ACCEPTANCE.get(self.family or "", (0.7,)))
        self.acceptance = [acc[min(i, len(acc) - 1)] for i in range(spec_k)]
        self.lookup = lookup
        self.rng = random.Random(seed)
        self.jitter_rng = random.Random(seed ^ 0x5EED)
        self.jitter = jitter
        self.total_blocks = max(0, limits.kv_capacity_tokens // limits.block_size)
        self.free_blocks = self.total_blocks
        """Blocks no request holds, the prefix cache's unheld cached blocks among them."""
        self.cache = cache or PrefixCache(limits.block_size, limits.block_size, enabled=False)
        self.running: list[SimRequest] = []
        self.waiting: list[SimRequest] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._admit_counter = 0
        self._now = 0.0
        self.steps = 0
        self.steps_behind = 0  # steps whose end the CPU could not keep up with
        self.time_lost_s = 0.0  # real time the clock gave up catching (CPU starved)
        self.simulated_time = 0.0
        # Whole-life totals, for identities in tests (the counters hold the same).
        self.total_emitted = 0
        self.total_drafts = 0
        self.total_draft_tokens = 0
        self.total_accepted = 0
        self.total_nodraft_emissions = 0

    # ---------------------------------------------------------------- public API
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)
        self.metrics.waiting.set(len(self.waiting))
        self._wake.set()

    def abort(self, req: SimRequest) -> None:
        """Client went away: drop the request, free its blocks, count it as aborted."""
        if req.finish_reason is not None:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._free(req)
        req.finish_reason = "abort"
        self.metrics.request_success["abort"].inc()

    @property
    def kv_usage(self) -> float:
        if self.total_blocks == 0:
            return 0.0
        return (self.total_blocks - self.free_blocks) / self.total_blocks

    # ---------------------------------------------------------------- internals
    def _free(self, req: SimRequest) -> None:
        # its own blocks come back; a cached block only when no other request holds it
        self.free_blocks += req.blocks - len(req.held) + self.cache.release(req.held)
        req.blocks = 0
        req.held = []

    def _grow(self, req: SimRequest, tokens: int) -> bool:
        """Make req hold blocks for `tokens` KV slots; False when blocks ran out."""
        need = -(-tokens // self.limits.block_size) - req.blocks
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        self.cache.evict(need - (self.free_blocks - len(self.cache.free)))
        self.free_blocks -= need
        req.blocks += need
        return True

    def _preempt_last(self) -> SimRequest | None:
        """Preempt (recompute) the most recently admitted running request."""
        if not self.running:
            return None
        victim = self.running.pop()
        self._free(victim)
        victim.computed = 0
        victim.prefill_target = victim.prompt_tokens + victim.emitted
        self.waiting.insert(0, victim)
        self.metrics.num_preemptions.inc()
        return victim

    def _draft_len(self, req: SimRequest) -> int:
        k = self.spec_k
        if k == 0:
            return 0
        if self.family != "ngram":
            return k
        proposer = req.proposer
        if proposer is None:
            tokens = req.stream.tokens
            if tokens is None:  # a stream without ids (none is made so): nothing to look up
                return 0
            proposer = req.proposer = NgramProposer(tokens.prompt(), *self.lookup)
            proposer.extend(tokens.upto(req.emitted))
        req.draft = proposer.propose(k, self.limits.max_model_len)
        return len(req.draft)

    def _ngram_accepted(self, req: SimRequest, draft_len: int) -> int:
        """Leading draft tokens equal to what the model emits next."""
        tokens = req.stream.tokens
        assert tokens is not None  # a draft is made only from a stream's ids
        return accepted_prefix(req.draft, tokens.upto(req.emitted + draft_len), req.emitted)

    def _accepted(self, draft_len: int) -> int:
        n = 0
        rnd = self.rng.random
        acc = self.acceptance
        while n < draft_len and rnd() < acc[n]:
            n += 1
        return n

    def _take_cached(self, req: SimRequest) -> None:
        """A request about to be admitted holds the cached blocks its prompt begins with and skips
        their prefill."""
        cache = self.cache
        req.cached_blocks = 0
        if not cache.enabled or req.prefix_ids is None:
            return
        if req.block_hashes is None:
            req.block_hashes = cache.hashes(req.prefix_ids())
        n = cache.cached(req.block_hashes, req.prompt_tokens)
        if n:
            self.free_blocks -= cache.take(req.block_hashes[:n])
            req.held = list(req.block_hashes[:n])
            req.blocks = n
            req.computed = n * self.limits.block_size
            req.cached_blocks = n

    def _count_lookup(self, req: SimRequest) -> None:
        """The prefix cache's counters, as vLLM counts at scheduling: the prompt looked up, its hits."""
        if not self.cache.enabled:
            return
        hit = req.cached_blocks * self.limits.block_size
        req.cache_hit_tokens = hit
        self.metrics.prefix_cache_queries.inc(req.prefill_target)
        if hit:
            self.metrics.prefix_cache_hits.inc(hit)
        if self.stats_logger is not None:
            self.stats_logger.record_lookup(req.prefill_target, hit)

    def _cache_prompt(self, req: SimRequest) -> None:
        """A prompt's full blocks, computed, are cached for the requests after it."""
        if self.cache.enabled and req.block_hashes:
            most = req.prompt_tokens // self.limits.block_size
            req.held += self.cache.add(req.block_hashes[len(req.held):most])

    def reset_prefix_cache(self) -> bool:
        """vLLM's /reset_prefix_cache: False while requests run (it refuses, and says so)."""
        if self.running or self.waiting:
            return False
        return self.cache.reset()

    def _schedule(self) -> tuple[list, list, StepShape]:
        """Pick this step's work: decodes (req, draft_len), prefills (req, chunk)."""
        lim = self.limits
        budget = lim.max_num_batched_tokens
        decodes: list[tuple[SimRequest, int]] = []
        prefills: list[tuple[SimRequest, int]] = []
        context = 0
        drafted = 0
        speculating = self.spec_k > 0
        i = 0
        while i < len(self.running):
            req = self.running[i]
            if req.computed < req.prefill_target:
                i += 1
                continue
            d = self._draft_len(req) if speculating else 0
            if budget < 1 + d:
                i += 1
                continue
            preempted_self = False
            while not self._grow(req, req.computed + 1 + d):
                # victims come from the end of the list, so never an already scheduled decode
                victim = self._preempt_last()
                if victim is req or victim is None:
                    preempted_self = True
                    break
            if preempted_self:
                break
            decodes.append((req, d))
            drafted += d
            context += req.computed
            budget -= 1 + d
            i += 1
        decode_budget = budget
        # prefills of running requests (chunked continuation)
        for req in self.running:
            if budget <= 0:
                break
            rem = req.prefill_target - req.computed
            if rem <= 0:
                continue
            chunk = min(rem, budget)
            if not self._grow(req, req.computed + chunk):
                continue
            prefills.append((req, chunk))
            budget -= chunk
        # admit waiting requests
        while self.waiting and budget > 0 and len(self.running) < lim.max_num_seqs:
            req = self.waiting[0]
            if req.computed == 0:
                self._take_cached(req)
            chunk = min(req.prefill_target - req.computed, budget)
            if not self._grow(req, req.computed + chunk):
                self._free(req)
                req.computed = req.cached_blocks = 0
                break
            self._count_lookup(req)
            self.waiting.pop(0)
            self._admit_counter += 1
            req.admit_seq = self._admit_counter
            if req.admit_time is None:
                req.admit_time = self._now
                self.metrics.queue_time.observe(self._now - req.arrival)
            self.running.append(req)
            prefills.append((req, chunk))
            budget -= chunk
        shape = StepShape(
            decode_seqs=len(decodes),
            context_tokens=context,
            spec_k=self.spec_k if drafted else 0,
            prefill_tokens=decode_budget - budget,
            prefill_seqs=len(prefills),
            draft_tokens=drafted,
        )
        return decodes, prefills, shape

    def _emit(self, decodes: list, prefills: list, now: float) -> None:
        """Hand the step's tokens out and count them, in one event-loop turn."""
        m = self.metrics
        emitted_total = 0
        drafts = draft_tokens = accepted_total = nodraft = 0
        per_pos = [0] * self.spec_k
        finished: list[SimRequest] = []
        itl_obs = m.itl.observe
        for req, d in decodes:
            if req.finish_reason is not None:
                continue
            remaining = req.max_new - req.emitted
            if d:
                acc = self._ngram_accepted(req, d) if self.family == "ngram" else self._accepted(d)
                acc = min(acc, remaining - 1)
                drafts += 1
                draft_tokens += d
                accepted_total += acc
                for p in range(acc):
                    per_pos[p] += 1
            else:
                acc = 0
                nodraft += 1
            n = 1 + acc
            if req.proposer is not None and req.stream.tokens is not None:
                req.proposer.extend(req.stream.tokens.upto(req.emitted + n)[req.emitted:req.emitted + n])
            req.emitted += n
            req.computed += n
            emitted_total += n
            itl_obs(now - req.last_token_time)
            req.last_token_time = now
            if req.emitted >= req.max_new:
                finished.append(req)
            if req.waiter is not None:
                req._wake()
        prompt_tokens = 0
        for req, chunk in prefills:
            if req.finish_reason is not None:
                continue
            req.computed += chunk
            if req.computed < req.prefill_target:
                continue
            # prefill complete: its last position samples one token (no draft)
            if not req.prompt_counted:
                req.prompt_counted = True
                prompt_tokens += req.prompt_tokens
                hit = min(req.cache_hit_tokens, req.prompt_tokens)
                m.request_prompt_tokens.observe(req.prompt_tokens)
                m.prompt_by_source["local_compute"].inc(req.prompt_tokens - hit)
                if hit:
                    m.prompt_by_source["local_cache_hit"].inc(hit)
                m.prefill_kv_computed.observe(req.prompt_tokens - hit)
                self._cache_prompt(req)
            req.emitted += 1
            emitted_total += 1
            nodraft += 1
            if req.first_token_time is None:
                req.first_token_time = now
                m.ttft.observe(now - req.arrival)
            else:
                itl_obs(now - req.last_token_time)
            req.last_token_time = now
            if req.emitted >= req.max_new:
                finished.append(req)
            req._wake()
        # counters, at the moment the tokens go out
        if emitted_total or prompt_tokens:
            m.iteration_tokens.observe(emitted_total + prompt_tokens)
        if emitted_total:
            m.generation_tokens.inc(emitted_total)
        if prompt_tokens:
            m.prompt_tokens.inc(prompt_tokens)
        if drafts:
            m.spec_drafts.inc(drafts)
            m.spec_draft_tokens.inc(draft_tokens)
            m.spec_accepted.inc(accepted_total)
            for p, a in enumerate(per_pos):
                if a:
                    m.spec_accepted_per_pos[p].inc(a)
        self.total_emitted += emitted_total
        self.total_drafts += drafts
        self.total_draft_tokens += draft_tokens
        self.total_accepted += accepted_total
        self.total_nodraft_emissions += nodraft
        for req in finished:
            self._finish(req, now)
        self._shrink_blocks(decodes)
        if self.stats_logger is not None:
            self.stats_logger.record_step(prompt_tokens, emitted_total, drafts, draft_tokens,
                                          accepted_total, per_pos)
        m.running.set(len(self.running))
        m.waiting.set(len(self.waiting))
        m.waiting_capacity.set(len(self.waiting))
        m.kv_usage.set(self.kv_usage)

    def _finish(self, req: SimRequest, now: float) -> None:
        """A request that emitted its last token: out of the batch, its blocks freed, its metrics."""
        m = self.metrics
        req.finish_reason = req.end_reason
        self.running.remove(req)
        self._free(req)
        m.request_success[req.end_reason].inc()
        m.e2e.observe(now - req.arrival)
        if req.emitted > 1 and req.first_token_time is not None:
            m.tpot.observe((now - req.first_token_time) / (req.emitted - 1))
        m.request_generation_tokens.observe(req.emitted)
        started = req.admit_time if req.admit_time is not None else req.arrival
        if req.first_token_time is not None:
            m.prefill_time.observe(max(0.0, req.first_token_time - started))
            m.decode_time.observe(max(0.0, now - req.first_token_time))
        m.inference_time.observe(max(0.0, now - started))
        m.request_preemptions.observe(0)

    def _shrink_blocks(self, decodes: list) -> None:
        """Blocks of running decodes shrunk to what their KV needs (the slots of rejected drafts)."""
        bs = self.limits.block_size
        for req, d in decodes:
            if d and req.finish_reason is None and req.blocks:  # a decode without a draft holds no spare slot
                keep = -(-req.computed // bs)
                if keep < req.blocks:
                    self.free_blocks += req.blocks - keep
                    req.blocks = keep

    def plan_step(self, now: float) -> tuple[list, list, float] | None:
        """The next step's work and its price in seconds, scheduled at `now`; None when there is
        nothing to run. The real-time loop and the virtual-time driver both step through here."""
        while True:
            self._now = now
            decodes, prefills, shape = self._schedule()
            if decodes or prefills:
                break
            if not self.running:
                return None
            self._preempt_last()  # KV full of half-prefilled requests: free room by recompute
        dt = self.pricer(shape)
        if self.jitter > 0:
            dt *= max(0.5, 1.0 + self.jitter_rng.gauss(0.0, self.jitter))
        self.simulated_time += dt
        return decodes, prefills, dt

    def emit_step(self, decodes: list, prefills: list, now: float) -> None:
        """Finish a planned step at `now`: its tokens go out and the counters move."""
        self.steps += 1
        self._emit(decodes, prefills, now)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        t_next = loop.time()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                t_next = loop.time()
            planned = self.plan_step(loop.time())
            if planned is None:
                self._wake.clear()
                await self._wake.wait()
                t_next = loop.time()
                continue
            decodes, prefills, dt = planned
            t_next += dt
            delay = t_next - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.steps_behind += 1
                if delay < -0.25:  # far behind (CPU starved): do not burst to catch up
                    self.time_lost_s += -delay  # simulated speed understated by this much
                    t_next = loop.time()
                await asyncio.sleep(0)
            self.emit_step(decodes, prefills, loop.time())
