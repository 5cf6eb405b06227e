"""Optional API keys: ``Authorization: Bearer KEY`` on every ``/v1/`` route.

Keys come from ``server.api_keys`` and from the environment variable named by
``server.api_keys_env`` (comma-separated). With no key configured, auth is off. The check
runs before the body is read, so a request without a valid key costs no work.
``/health``, ``/ready`` and ``/metrics`` stay open for probes and scrapers.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.gateway.config import ServerConfig
from orchestrator.gateway.errors import APIError

PROTECTED_PREFIX = "/v1/"


def configured_keys(server: ServerConfig, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Keys from the config plus those in ``environ[server.api_keys_env]``."""
    from_env = environ.get(server.api_keys_env, "")
    keys = [*server.api_keys, *(k.strip() for k in from_env.split(","))]
    return [k for k in keys if k]


def key_matches(presented: str, keys: Iterable[str]) -> bool:
    """Constant-time comparison against every key (no early exit on a match, so timing
    reveals neither the key nor which one matched)."""
    given = presented.encode()
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key.encode())
    return found


class APIKeyMiddleware:
    """Answers 401 to a ``/v1/`` request without a valid bearer key."""

    def __init__(self, app: ASGIApp, keys: list[str]) -> None:
        if not keys:
            raise ValueError("APIKeyMiddleware needs at least one key; leave it out for no auth")
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PROTECTED_PREFIX):
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not key_matches(token.strip(), self.keys):
            message = (
                "missing API key: send 'Authorization: Bearer <key>'"
                if not header
                else "invalid API key"
            )
            error = APIError(
                401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
            )
            await error.send(scope, receive, send)
            return
        await self.app(scope, receive, send)
