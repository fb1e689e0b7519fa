"""Errors qlower raises at compile time instead of opaque library failures at run time.

Dynamo wraps whatever a backend raises in `BackendCompilerFailed`, except the exceptions it re-raises as they
are (`torch/_dynamo/output_graph.py`, `_call_user_compiler`): `ShortenTraceback` subclasses among them. qlower's
errors are such a subclass, so `except qlower.UnsupportedPlatformError` around a compiled call catches the error
qlower raised, not a wrapper
(tests/lowerings/registry/test_errors_and_options.py::test_unsupported_platform_error_is_catchable_*).
"""

from __future__ import annotations

from torch._dynamo.exc import ShortenTraceback


class QLowerError(ShortenTraceback):
    """Base class of qlower's errors (a RuntimeError; Dynamo passes it to the caller unwrapped)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, first_useful_frame=None)  # keep the whole traceback


class UnsupportedPlatformError(QLowerError):
    """An explicit kernel preference that this device (or this candidate on it) cannot honour."""
