"""Errors the build pipeline reports to its user (no traceback needed)."""

from __future__ import annotations


class BuildError(RuntimeError):
    """A step could not run or failed; the message says which, why and what to do."""


class VerificationError(BuildError):
    """The built artefact differs from the spec; the message lists every difference."""
