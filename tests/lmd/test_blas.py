"""lmdecomp.lmd.blas.syrk_lower: scipy's dsyrk, bit for bit, with the GIL released."""

import threading
import time

import numpy as np
import pytest
from scipy.linalg.blas import dsyrk

from lmdecomp.lmd import blas_threads
from lmdecomp.lmd.blas import syrk_lower


@pytest.mark.parametrize("rows, width", [(1, 3), (7, 5), (300, 257)])
def test_syrk_lower_is_scipys_dsyrk_bit_for_bit_and_leaves_the_upper_triangle(rows, width):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, width))
    start = rng.standard_normal((width, width))
    ours = start.copy()
    syrk_lower(ours, x)
    # the f2py wrapper on the Fortran views, as the pass called it until 2026-12-04
    theirs = start.copy()
    dsyrk(1.0, x.T, beta=1.0, c=theirs.T, trans=0, lower=0, overwrite_c=1)
    assert np.array_equal(ours, theirs)
    lower = np.tril_indices(width)
    # and the arithmetic itself, in an explicit float64 product
    np.testing.assert_allclose(ours[lower], (start + x.T @ x)[lower], rtol=1e-12, atol=1e-12)
    upper = np.triu_indices(width, 1)
    assert np.array_equal(ours[upper], start[upper])


@pytest.mark.parametrize("rows, width", [(4, 6), (0, 6), (300, 257)])
def test_syrk_lower_with_beta_zero_overwrites_the_lower_triangle_without_reading_it(rows, width):
    """beta = 0 (a leave-one-out fit's Gram, one buffer for every target): the lower triangle
    becomes xᵀx even where it held NaN, the upper one is left as it was, and the bits are scipy's
    dsyrk with beta = 0 (at 257 wide on both BLAS threads, where the scaling is split too)."""
    x = np.random.default_rng(5).standard_normal((rows, width))
    start = np.triu(np.arange(float(width * width)).reshape(width, width), 1) + np.tril(np.full((width, width), np.nan))
    ours = start.copy()
    with blas_threads(2):
        syrk_lower(ours, x, beta=0.0)
        theirs = start.copy()
        dsyrk(1.0, x.T, beta=0.0, c=theirs.T, trans=0, lower=0, overwrite_c=1)
    lower, upper = np.tril_indices(width), np.triu_indices(width, 1)
    np.testing.assert_allclose(ours[lower], (x.T @ x)[lower], rtol=1e-12, atol=1e-12)
    assert np.array_equal(ours[upper], start[upper])
    assert np.array_equal(ours, theirs)


def test_syrk_lower_adds_nothing_for_zero_rows():
    cross = np.arange(9.0).reshape(3, 3)
    syrk_lower(cross, np.empty((0, 3)))
    assert np.array_equal(cross, np.arange(9.0).reshape(3, 3))


@pytest.mark.parametrize("cross, rows, what", [
    (np.zeros((3, 3), np.float32), np.ones((2, 3)), "float64"),
    (np.zeros((3, 4)), np.ones((2, 3)), "square"),
    (np.zeros((3, 3)), np.ones((2, 4)), r"\(k × 3\)"),
    (np.zeros((3, 3)), np.ones((3, 2)).T, "C-ordered"),
    (np.asfortranarray(np.arange(9.0).reshape(3, 3)), np.ones((2, 3)), "C-ordered"),
])
def test_syrk_lower_refuses_what_it_cannot_update_in_place(cross, rows, what):
    with pytest.raises(ValueError, match=what):
        syrk_lower(cross, rows)


def test_syrk_lower_lets_other_python_threads_run():
    """A pure-Python thread counts during one large update; under scipy's wrapper (the GIL held)
    it counted ~0.1 % of what it counts in the same time with the GIL free."""
    rng = np.random.default_rng(0)
    x, cross = rng.standard_normal((1500, 2000)), np.zeros((2000, 2000))
    count, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    spinner = threading.Thread(target=spin)
    with blas_threads(1):
        spinner.start()
        time.sleep(0.05)
        before, start = count[0], time.perf_counter()
        syrk_lower(cross, x)
        during, elapsed = count[0] - before, time.perf_counter() - start
        time.sleep(elapsed)
        after = count[0] - before - during
    stop.set()
    spinner.join()
    # with the GIL held the spinner barely runs (a switch interval's worth at the start)
    assert during > 0.2 * after, (during, after, elapsed)


@pytest.mark.parametrize("user_setting, expected", [(None, "20"), ("8", "8")])
def test_importing_lmdecomp_shortens_openblas_idle_spin_unless_the_user_set_it(user_setting, expected):
    """OpenBLAS reads OPENBLAS_THREAD_TIMEOUT when it loads, so `import lmdecomp` sets it (2^20
    cycles, not 2^28) before scipy's OpenBLAS loads, and keeps a value the user gave."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if user_setting is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = user_setting
    code = ("import os, sys; import lmdecomp; assert 'scipy.linalg' not in sys.modules; "
            "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected
