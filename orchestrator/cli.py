"""`orchestrator` command line: one sub-command per job, each defined in its own module.

Each module named in ``COMMAND_MODULES`` exposes ``register(subparsers)``, which adds its
parsers with ``set_defaults(func=...)``; ``func(args)`` returns the exit code. Modules
import their heavy dependencies inside ``func`` so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES: tuple[str, ...] = (
    "orchestrator.gateway.cli",
    "orchestrator.sim.cli",
    "orchestrator.bench.cli",
    "orchestrator.doctor",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Serve, simulate, tune and benchmark LLM inference.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
