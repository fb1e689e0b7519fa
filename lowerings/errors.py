"""Errors qlower raises at compile time instead of opaque library failures at run time."""

from __future__ import annotations


class QLowerError(RuntimeError):
    """Base class of qlower's errors."""


class UnsupportedPlatformError(QLowerError):
    """An explicit kernel preference that this device (or this candidate on it) cannot honour."""
