"""The one error type the benchmark raises for bad input or an unusable server."""

from __future__ import annotations


class BenchError(Exception):
    """The benchmark cannot run as asked (server unreachable, not OpenAI-compatible, bad
    workload file or option); the message says what was wrong and with which input."""
