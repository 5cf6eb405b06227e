"""``orchestrator serve``: the OpenAI-compatible gateway."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the OpenAI-compatible API",
        description="Serve /v1/completions and /v1/chat/completions from the configured "
        "model. SIGTERM drains in-flight requests before exiting.",
    )
    parser.add_argument("--config", type=Path, required=True, help="engine YAML")
    parser.add_argument("--host", help="bind address (default: server.host in the config)")
    parser.add_argument("--port", type=int, help="port (default: server.port in the config)")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.core import ConfigError
    from orchestrator.gateway.config import load_serve_config
    from orchestrator.gateway.server import serve

    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    try:
        config = load_serve_config(args.config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return serve(config, args.host, args.port)
