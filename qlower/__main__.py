"""`python -m qlower <command>`: one subparser and one small function per command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from qlower import demo

    return demo.main(
        args.family, args.device, tuple(args.sizes), args.hidden, args.intermediate, args.threads
    )


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from qlower import FAMILIES
    from qlower.quantize import QUANTIZERS

    p = sub.add_parser("demo", help="quantize a Llama-style block, compile with and without qlower, compare")
    p.add_argument("--family", default="woq_int8", choices=[f for f in FAMILIES if f in QUANTIZERS])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 128], help="sequence lengths M to run")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.set_defaults(func=_demo)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qlower", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    from qlower.lowerings.aoti import cli as shims_cli

    shims_cli.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
