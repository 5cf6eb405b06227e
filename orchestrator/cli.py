"""`orchestrator` command line: one sub-command per job, each defined in its own module.

Each module named in ``COMMAND_MODULES`` exposes ``register(subparsers)``, which adds its
parsers with ``set_defaults(func=...)``; ``func(args)`` returns the exit code. Modules
import their heavy dependencies inside ``func`` so ``--help`` stays fast.

Commands that live in plug-ins (``orchestrator/`` imports none) are modules of the same
shape named by the ``orchestrator.commands`` entry point group. A command whose flags
belong to another tool's parser sets ``passthrough=True``: its unparsed arguments reach
``func`` as ``args.passthrough_args`` instead of being an error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

COMMAND_MODULES: tuple[str, ...] = (
    "orchestrator.gateway.cli",
    "orchestrator.sim.cli",
    "orchestrator.bench.cli",
    "orchestrator.doctor",
)
COMMAND_ENTRY_POINTS = "orchestrator.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orchestrator",
        description="Serve, simulate, tune and benchmark LLM inference.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for entry_point in entry_points(group=COMMAND_ENTRY_POINTS):
        entry_point.load().register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.passthrough_args = rest
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
