"""Errors the TensorRT-LLM adapter raises from ``execute``."""

from __future__ import annotations


class TrtllmError(RuntimeError):
    """The executor cannot carry on with the plan it was given."""


class TrtllmStalledError(TrtllmError):
    """No token came for some requests within ``step_timeout_s``."""
