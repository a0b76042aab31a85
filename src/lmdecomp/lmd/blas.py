"""The one BLAS call of the streaming pass, made without holding the GIL.

scipy's Python wrappers of BLAS (``scipy.linalg.blas``, made with f2py) hold the GIL for the
whole call. The moments pass spends most of its time in one of them, the rank-k update
``dsyrk``, while a worker thread reads, hashes and decodes the next shards
(:func:`lmdecomp.lmd.stream.read_ahead`). That thread's Python steps between its GIL-free C
calls then wait for every update to finish, so reading and updating ran one after the other.
Measured 2026-12-04 (Intel Xeon with AMX, 2 threads, 12 models × 768 at N = 50,000): the pass
waited 7–9 s of its ~58 s for the reader, which needs about 8 s on its own; a pure-Python thread
counted 48 thousand loops during a 2.4 s ``dsyrk`` and 35 million in the same time after it.
With the GIL released the pass still waits ~7 s (the reader, a third thread on two busy cores,
is starved of CPU), and its time moved within noise: 54.9 / 55.3 / 59.9 s against 57.0 / 58.6 /
58.6 s with the GIL held (docs/performance.md).

:func:`syrk_lower` calls the same routine of the same library, scipy's OpenBLAS, through the C
function pointer that ``scipy.linalg.cython_blas`` exports, with ctypes, which releases the GIL
for a foreign call. Same routine, same arguments, same thread count: the same bits.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

_INT, _DOUBLE = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_double)
# dsyrk(uplo, trans, n, k, alpha, a, lda, beta, c, ldc), Fortran calling convention: all by pointer
_DSYRK_ARGS = (ctypes.c_char_p, ctypes.c_char_p, _INT, _INT, _DOUBLE, _DOUBLE, _INT, _DOUBLE, _DOUBLE, _INT)


@functools.cache
def _dsyrk():
    from scipy.linalg import cython_blas

    capsule = cython_blas.__pyx_capi__["dsyrk"]
    name_of, pointer_of = ctypes.pythonapi.PyCapsule_GetName, ctypes.pythonapi.PyCapsule_GetPointer
    name_of.restype, name_of.argtypes = ctypes.c_char_p, [ctypes.py_object]
    pointer_of.restype, pointer_of.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return ctypes.CFUNCTYPE(None, *_DSYRK_ARGS)(pointer_of(capsule, name_of(capsule)))


def syrk_lower(cross: np.ndarray, rows: np.ndarray, beta: float = 1.0) -> None:
    """cross = beta·cross + rowsᵀ rows on the lower triangle of the C-ordered square float64
    ``cross``, in place, the GIL released; ``rows`` (k × w) C-ordered float64. The upper
    triangle is left as it was; with ``beta`` = 0 the lower one is not read.

    In Fortran's column-major view ``cross`` is Cᵀ and ``rows`` is A = rowsᵀ (w × k, leading
    dimension w), so the call is dsyrk('U', 'N'): the upper triangle of Cᵀ = beta·Cᵀ + A Aᵀ."""
    width = cross.shape[0]
    if cross.dtype != np.float64 or rows.dtype != np.float64 or cross.shape != (width, width) \
            or rows.ndim != 2 or rows.shape[1] != width:
        raise ValueError(f"syrk_lower needs a float64 square cross and float64 (k × {width}) rows; "
                         f"got {cross.dtype} {cross.shape} and {rows.dtype} {rows.shape}")
    if not (cross.flags.c_contiguous and cross.flags.writeable and rows.flags.c_contiguous):
        raise ValueError("syrk_lower needs a writeable C-ordered cross and C-ordered rows")
    if rows.shape[0] == 0 and beta == 1.0:
        return
    n, k = ctypes.c_int(width), ctypes.c_int(rows.shape[0])
    one, scale = ctypes.c_double(1.0), ctypes.c_double(beta)
    _dsyrk()(b"U", b"N", ctypes.byref(n), ctypes.byref(k), ctypes.byref(one), rows.ctypes.data_as(_DOUBLE),
             ctypes.byref(n), ctypes.byref(scale), cross.ctypes.data_as(_DOUBLE), ctypes.byref(n))
