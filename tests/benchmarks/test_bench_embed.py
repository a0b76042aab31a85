"""benchmarks/bench_embed.py's arithmetic behind its speed targets: the fraction of a dtype's
matmul peak that a target asks for, against hand-computed cases."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench_embed():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling peak_memory
    try:
        spec = importlib.util.spec_from_file_location("bench_embed", BENCHMARKS / "bench_embed.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_peak_needed_hand_computed(bench_embed):
    # 2 × a reference at 100 tok/s is 200 tok/s; at 0.2 GFLOP per token that is 40 GFLOP/s,
    # 0.8 of a 50 GFLOP/s peak
    method = {"tokens_per_s": 50.0, "gflops_per_s": 10.0}
    assert bench_embed.peak_needed(2.0, {"tokens_per_s": 100.0}, method, 50.0) == pytest.approx(0.8, rel=1e-15)


def test_peak_needed_of_a_method_against_itself_is_its_own_fraction(bench_embed):
    method = {"tokens_per_s": 3542.0, "gflops_per_s": 79.5}
    assert bench_embed.peak_needed(1.0, method, method, 124.4) == pytest.approx(79.5 / 124.4, rel=1e-15)


def test_peak_needed_beyond_the_peak(bench_embed):
    # 2026-12-07's AVX2-only EPYC: 3 × the pipeline (2,249 tok/s) from lmdecomp float32
    # (3,542 tok/s at 79.5 GFLOP/s) on a 124.4 GFLOP/s float32 peak
    lmdecomp = {"tokens_per_s": 3542.0, "gflops_per_s": 79.5}
    needed = bench_embed.peak_needed(3.0, {"tokens_per_s": 2249.0}, lmdecomp, 124.4)
    # by hand: 79.5 / 3,542 = 0.0224449 GFLOP per token; × 3 × 2,249 = 151.436 GFLOP/s; ÷ 124.4
    assert needed == pytest.approx(1.21733, rel=1e-5)
