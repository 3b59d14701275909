"""`python -m truthput.sim serve [vLLM flags...] [--sim-* flags]`: the simulated vLLM server.

Launched as a subprocess exactly like a real engine. Calibration is `truthput sim calibrate`.
"""

from __future__ import annotations

import sys

USAGE = ("usage: python -m truthput.sim {serve,batch} [args...]  (serve --help lists every flag; "
         "batch evaluates JSON-lines configurations in virtual time)")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "serve":
        from truthput.sim.server import serve

        return serve(rest)
    if cmd == "batch":
        from truthput.sim.virtual import batch_main

        return batch_main(rest)
    print(f"truthput-sim: error: unknown command {cmd!r}; {USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
