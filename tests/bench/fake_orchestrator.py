"""Stand-in for the ``orchestrator`` command in the test of
``benchmarks/serve_continuous_vs_static.sh``: ``serve`` runs the SSE test server on the
given port, serving a model named after the config's ``scheduler.batching`` (so a test can
tell which config each run met) and three times slower per token in static mode;
``bench`` is the real benchmark client."""

from __future__ import annotations

import argparse
import sys

import yaml

from orchestrator.bench.cli import register
from tests.bench.sse_server import Behaviour, serve_forever

ITL_S = {"continuous": 0.004, "static": 0.012}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    serve = sub.add_parser("serve")
    serve.add_argument("--config", required=True)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "bench":
        code: int = args.func(args)
        return code
    with open(args.config) as f:
        mode = yaml.safe_load(f)["scheduler"]["batching"]
    serve_forever(Behaviour(ttft_s=0.01, itl_s=ITL_S[mode], model=f"stand-in-{mode}"), args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
