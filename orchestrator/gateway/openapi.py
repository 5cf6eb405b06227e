"""``/openapi.json`` as the gateway behaves.

FastAPI documents a 422 with its own error body for every route that validates input,
but this gateway answers invalid input with a 400 in OpenAI's error format
(``errors.py``), which the routes declare themselves: the 422s and the schemas only they
used are removed. FastAPI also passes every schema through its OpenAPI model, whose
numeric bounds are floats, so ``9223372036854775807`` would come out as ``2**63``: the
exact integer bounds are put back from pydantic's own schemas of the request models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_FASTAPI_ONLY_SCHEMAS = ("HTTPValidationError", "ValidationError")
_BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_EXACT_FLOAT_INTS = 2**53  # integers up to this survive a trip through a float
_REF = "#/components/schemas/{model}"


def install_openapi(
    app: FastAPI, description: str, request_models: Sequence[type[BaseModel]]
) -> None:
    """Make ``app.openapi()`` (served at ``/openapi.json``) return the corrected schema;
    ``request_models`` are the bodies whose exact bounds to restore."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=description,
                routes=app.routes,
            )
            for path_item in schema.get("paths", {}).values():
                for operation in path_item.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.get("components", {}).get("schemas", {})
            for name in _FASTAPI_ONLY_SCHEMAS:
                components.pop(name, None)
            _integral_bounds(schema)
            for model in request_models:
                exact = model.model_json_schema(ref_template=_REF)
                for name, sub in [(model.__name__, exact), *exact.pop("$defs", {}).items()]:
                    if name in components:
                        _copy_bounds(sub, components[name])
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _integral_bounds(node: Any) -> None:
    """Bounds such as ``16.0`` back to ``16`` wherever the float is exact."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _BOUNDS and isinstance(value, float) and value.is_integer():
                if abs(value) < _EXACT_FLOAT_INTS:
                    node[key] = int(value)
            else:
                _integral_bounds(value)
    elif isinstance(node, list):
        for item in node:
            _integral_bounds(item)


def _copy_bounds(source: Any, target: Any) -> None:
    """Copy integer bounds from ``source`` into the same places of ``target`` (two
    renderings of one schema)."""
    if isinstance(source, dict) and isinstance(target, dict):
        for key, value in source.items():
            if key not in target:
                continue
            if key in _BOUNDS and isinstance(value, int):
                target[key] = value
            else:
                _copy_bounds(value, target[key])
    elif isinstance(source, list) and isinstance(target, list) and len(source) == len(target):
        for s, t in zip(source, target, strict=True):
            _copy_bounds(s, t)
