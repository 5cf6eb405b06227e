"""``orchestrator dynamo-worker --config FILE [Dynamo's runtime flags]``: one worker of a
Dynamo deployment. Registered through the ``orchestrator.commands`` entry point group
(``orchestrator/`` imports no plug-in); Dynamo is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = "serve a serve config's engine as an NVIDIA Dynamo backend worker"


def register(subparsers: Any) -> None:
    # Every flag (ours and Dynamo's runtime flags, with their DYN_* variables) is
    # parsed by the worker's own parser, so `--help` shows them all.
    parser = subparsers.add_parser("dynamo-worker", help=HELP, add_help=False)
    parser.set_defaults(func=run, passthrough=True)


def run(args: argparse.Namespace) -> int:
    """Run the worker until Dynamo shuts it down (SIGTERM or SIGINT); the exit code."""
    try:
        from dynamo.common.backend.run import run as run_worker

        from plugins.dynamo.engine import OrchestratorEngine
    except ImportError as exc:
        print(
            f"orchestrator dynamo-worker needs NVIDIA Dynamo ({exc}); run `make install`, "
            "which builds .venv-dynamo, and use .venv-dynamo/bin/orchestrator",
            file=sys.stderr,
        )
        return 2
    run_worker(OrchestratorEngine, argv=list(args.passthrough_args))
    return 0
