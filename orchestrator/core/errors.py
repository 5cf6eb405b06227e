"""Typed errors the engine raises at submission; the gateway maps each to one status code."""

from __future__ import annotations

import math


class EngineError(Exception):
    """Base class for errors a client caused or must be told about."""


class AdmissionError(EngineError, ValueError):
    """The request can never be served as asked (e.g. prompt over the model's context, or
    more KV blocks than the pool holds, or an unknown SLO class). Nothing was queued.
    HTTP 400; ``param`` names the request field at fault, where one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class OverloadedError(EngineError):
    """The engine cannot take the request now. Nothing was queued. HTTP 429.

    ``retry_after_s`` (seconds) is the predicted time until the work queued ahead has
    drained enough for the request to be admitted (the client's ``Retry-After``).
    ``code`` says why, for the API error body's ``code``: ``queue_full`` (the waiting
    request limit), ``queue_tokens_full`` (the waiting token limit) or
    ``ttft_unattainable`` (SLO admission predicted a TTFT over the class's target).
    """

    def __init__(
        self, message: str, retry_after_s: float = 1.0, code: str = "server_overloaded"
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.code = code

    @property
    def retry_after_header_s(self) -> int:
        """The wait a client is told (s): HTTP's ``Retry-After`` carries whole seconds
        (RFC 9110 delay-seconds), so ``retry_after_s`` rounded up, at least 1. A client
        that honours it comes back this long after the refusal."""
        return retry_after_header_s(self.retry_after_s)


def retry_after_header_s(retry_after_s: float) -> int:
    """``retry_after_s`` as ``Retry-After`` carries it: whole seconds, rounded up, >= 1."""
    return max(1, math.ceil(retry_after_s))


class EngineDeadError(EngineError):
    """The engine loop stopped (crash or shutdown); in-flight requests end with this."""
