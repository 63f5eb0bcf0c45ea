"""Errors a user can fix (bad config, unusable artifact); the CLI prints them without a traceback."""

from __future__ import annotations


class RetrieverError(ValueError):
    pass
