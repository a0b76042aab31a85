"""lmdecomp: decompose language models across models (LMD) and within a model (MPO)."""

__version__ = "0.1.0"
