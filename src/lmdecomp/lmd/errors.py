"""Errors and warnings of the LMD fits."""

from __future__ import annotations


class LMDError(ValueError):
    """Embeddings or settings that cannot give a well-posed fit."""


class AlphaGridEdgeWarning(UserWarning):
    """The val-selected α is the largest (or smallest non-zero) of its grid: the optimum may lie outside."""
