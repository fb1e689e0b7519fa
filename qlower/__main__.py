"""`python -m qlower <command>`: one subparser and one small function per command.

A request the machine cannot serve (`demo --device cuda` on a torch without CUDA, a bad option value) ends with
one line on stderr and exit status 2, not a traceback (tests/tools/test_first_use.py::test_cli_*).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

USAGE_ERROR = 2  # argparse's exit status for a bad command line; a request this machine cannot serve too


def version() -> str:
    """The installed distribution's version; the package's own `__version__` when it runs from a source tree."""
    from importlib import metadata

    try:
        return metadata.version("qlower")
    except metadata.PackageNotFoundError:
        import qlower

        return getattr(qlower, "__version__", "unknown")


def _demo(args: argparse.Namespace) -> int:
    from qlower import demo

    return demo.main(
        args.family, args.device, tuple(args.sizes), args.hidden, args.intermediate, args.threads, mx=args.mx
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
    p.add_argument(
        "--no-mx", dest="mx", action="store_false", help="skip the small MX weight-only linear at the end"
    )
    p.set_defaults(func=_demo)


def _build(args: argparse.Namespace) -> int:
    """Build qlower's CUTLASS library now (nvcc, sm_90a; no GPU needed) and print its path and seconds."""
    import shutil
    from pathlib import Path

    from qlower.lowerings.kernels.cutlass import build

    tc = build.toolchain()
    if isinstance(tc, str):
        raise ValueError(tc)
    lib = build.build(tc, jobs=args.jobs, log=print)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        lib = Path(shutil.copy2(lib, args.out / build.LIBRARY_NAME))
    print(f"QLOWER_CUTLASS_LIBRARY={lib}")
    return 0


def _add_build(sub: argparse._SubParsersAction) -> None:
    from pathlib import Path

    p = sub.add_parser(
        "build",
        help="build the CUDA (CUTLASS) kernels ahead of time; --out copies the library for another machine",
    )
    p.add_argument("--out", type=Path, default=None, help="copy the library into this folder")
    p.add_argument(
        "--jobs", type=int, default=None, help="parallel nvcc jobs (default: one per configuration)"
    )
    p.set_defaults(func=_build)


def _one_line(command: str, error: BaseException) -> str:
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    text = text.removeprefix("qlower: ")
    return f"python -m qlower {command}: {text or type(error).__name__}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qlower", description=__doc__)
    parser.add_argument("--version", action="version", version=f"qlower {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_build(sub)
    from qlower.lowerings import UnsupportedPlatformError
    from qlower.lowerings.aoti import cli as shims_cli

    shims_cli.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (UnsupportedPlatformError, ValueError) as e:
        print(_one_line(args.command, e), file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
