"""``orchestrator doctor``: what this machine would run a config on, without loading it.

Prints the package version and the executor's own report (``describe`` on its factory,
where it has one: for the torch executor, the CPU, the features read from it, the kernel
variant, dtype and weight format that ``dtype: auto`` and friends resolve to here).
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="show what this machine would run a config on",
        description="Print the version and the executor's platform report for a config.",
    )
    parser.add_argument("--config", type=Path, required=True, help="engine YAML")
    parser.set_defaults(func=run)


def package_version() -> str:
    try:
        return version("trtllm-orchestrator")
    except PackageNotFoundError:
        return "unknown (not installed)"


def run(args: argparse.Namespace) -> int:
    from orchestrator.core import ConfigError, load_engine_config
    from orchestrator.core.executor import executor_class

    try:
        config = load_engine_config(args.config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"orchestrator {package_version()}")
    print(f"executor: {config.executor.type}")
    factory = executor_class(config.executor.type)
    describe = getattr(factory, "describe", None)
    if describe is None:
        print("  (this executor gives no platform report)")
        return 0
    try:
        rows = describe(config.executor.options, config)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for key, value in rows:
        print(f"  {key}: {value}")
    return 0
