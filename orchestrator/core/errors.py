"""Typed errors the engine raises at submission; the gateway maps each to one status code."""

from __future__ import annotations


class EngineError(Exception):
    """Base class for errors a client caused or must be told about."""


class AdmissionError(EngineError, ValueError):
    """The request can never be served as asked (e.g. prompt over the model's context, or
    more KV blocks than the pool holds). Nothing was queued. HTTP 400."""


class OverloadedError(EngineError):
    """The waiting queue is at its request or token limit. Nothing was queued. HTTP 429;
    ``retry_after_s`` is a hint for the client's ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineDeadError(EngineError):
    """The engine loop stopped (crash or shutdown); in-flight requests end with this."""
