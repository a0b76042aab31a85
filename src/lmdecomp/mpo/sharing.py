"""The shared central tensor of MPOBERT's stable initialisation (:mod:`lmdecomp.mpo.mpobert`, step 1).

For a weight type, each base layer's weight, unfolded around the central core (interleaved as
in :func:`~lmdecomp.mpo.decompose.mpo_decompose`), is a 3-way tensor ``M_l`` of shape
``(P, m, Q)``: ``P = ∏_{k<c} i_k j_k`` (left cores), ``m = i_c j_c`` (central),
``Q = ∏_{k>c} i_k j_k`` (right cores). :func:`shared_central_fit` fits::

    min_{C, A_l, B_l}  Σ_l ‖M_l − C ×₁ A_l ×₃ B_l‖²,   A_lᵀA_l = I,  B_l B_lᵀ = I

(a Tucker-2 model with a core shared by all layers) by alternating exact updates, and
:func:`_split` / :func:`_split_right` cut ``A_l`` and ``B_l`` into the auxiliary cores by exact
TT-SVD, left- and right-orthonormal respectively, so every auxiliary core is an isometry and ``C``
carries the norm (the mixed-canonical form of :func:`~lmdecomp.mpo.decompose.mpo_decompose`).
:func:`mpo_bond_dims` gives the bonds that result.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor, nn

from lmdecomp.mpo.decompose import _gauge_to_centre, factorize


# --------------------------------------------------------------------------- #
# shapes
# --------------------------------------------------------------------------- #
def _interleaved_dims(out_shape: Sequence[int], in_shape: Sequence[int]) -> list[int]:
    return [i * j for i, j in zip(out_shape, in_shape)]


def _sweep_ranks(first: int, dims: Sequence[int], last: int) -> list[int]:
    """Bonds of an exact left-to-right TT-SVD of a ``(first, *dims, last)`` tensor: the
    bond after mode ``k`` is ``min(rows, cols)`` of the unfolding split there."""
    ranks, r = [], first
    for k in range(len(dims) - 1):
        r = min(r * dims[k], math.prod(dims[k + 1 :]) * last)
        ranks.append(r)
    return ranks


def mpo_bond_dims(out_shape: Sequence[int], in_shape: Sequence[int], bond: int | None) -> list[int]:
    """``[1, r_1, …, r_{n−1}, 1]`` of a shared-central MPO: the central bonds ``r_left,
    r_right`` capped by ``bond``, the auxiliary bonds those of an exact TT-SVD."""
    n = len(out_shape)
    c = n // 2
    d = _interleaved_dims(out_shape, in_shape)
    p, m, q = math.prod(d[:c]), d[c], math.prod(d[c + 1 :])
    cap = bond if bond is not None else max(p, q)
    r_left = min(p, m * q, cap)
    r_right = min(q, r_left * m, cap)
    left = _sweep_ranks(1, d[:c], r_left)
    right = _sweep_ranks(r_right, d[c + 1 :], 1)
    return [1, *left, r_left, r_right, *right, 1]


def _layer_shapes(linear: nn.Linear, n_cores: int, name: str = "weight") -> tuple[list[int], list[int]]:
    """:func:`~lmdecomp.mpo.factorize` of the weight's two sides. A side with a single
    factor > 1 (a prime width ``p`` gives ``[1, 1, p, 1, 1]``) is refused: that whole
    dimension would sit in the shared central tensor, so sharing it would share (almost)
    the whole matrix and the auxiliary cores would hold nothing layer-specific."""
    out_f, in_f = linear.weight.shape
    shapes = factorize(out_f, n_cores), factorize(in_f, n_cores)
    for side, dim, factors in (("output", out_f, shapes[0]), ("input", in_f, shapes[1])):
        if dim > 1 and sum(f > 1 for f in factors) < 2:
            raise ValueError(
                f"MPOBERT cannot split the {side} width {dim} of {name} into {n_cores} cores: it factorizes as "
                f"{factors} (one non-trivial factor), so the shared central tensor would hold that whole side; "
                "choose a width with at least two prime factors (e.g. not a prime)"
            )
    return shapes


# --------------------------------------------------------------------------- #
# the shared-central fit
# --------------------------------------------------------------------------- #
def _unfold(weight: Tensor, out_shape: Sequence[int], in_shape: Sequence[int]) -> Tensor:
    """``W`` (out × in) as the interleaved ``(P, m, Q)`` tensor around the central core."""
    n = len(out_shape)
    c = n // 2
    d = _interleaved_dims(out_shape, in_shape)
    t = weight.reshape(*out_shape, *in_shape).permute([p for k in range(n) for p in (k, n + k)])
    return t.reshape(math.prod(d[:c]), d[c], math.prod(d[c + 1 :]))


def _procrustes(k: Tensor) -> Tensor:
    """``argmax_{AᵀA = I} tr(Aᵀ K)`` = ``U Vᵀ`` for ``K = U S Vᵀ``."""
    u, _, vh = torch.linalg.svd(k, full_matrices=False)
    return u @ vh


def shared_central_fit(
    weights: Sequence[Tensor],
    out_shape: Sequence[int],
    in_shape: Sequence[int],
    r_left: int,
    r_right: int,
    iterations: int = 10,
) -> tuple[Tensor, list[Tensor], list[Tensor], list[float]]:
    """Fit ``M_l ≈ C ×₁ A_l ×₃ B_l`` for all layers with one ``C`` (module docstring,
    step 1), in float64. Returns ``C (r_left, m, r_right)``, ``A_l (P, r_left)``,
    ``B_l (r_right, Q)`` and each layer's relative error ``‖W_l − Ŵ_l‖_F / ‖W_l‖_F``."""
    ms = [_unfold(w.detach().double(), out_shape, in_shape) for w in weights]
    p, m, q = ms[0].shape
    a = [torch.linalg.svd(x.reshape(p, m * q), full_matrices=False)[0][:, :r_left] for x in ms]
    b = [torch.linalg.svd(x.reshape(p * m, q), full_matrices=False)[2][:r_right] for x in ms]

    def central() -> Tensor:
        return torch.stack([torch.einsum("pa,pmq,bq->amb", al, x, bl) for al, x, bl in zip(a, ms, b)]).mean(0)

    for _ in range(iterations):
        c = central()
        a = [_procrustes(x.reshape(p, m * q) @ torch.einsum("amb,bq->amq", c, bl).reshape(r_left, m * q).T) for x, bl in zip(ms, b)]
        b = [_procrustes(x.reshape(p * m, q).T @ torch.einsum("pa,amb->pmb", al, c).reshape(p * m, r_right)).T for x, al in zip(ms, a)]
    c = central()
    errors = [float(torch.linalg.norm(x - torch.einsum("pa,amb,bq->pmq", al, c, bl)) / torch.linalg.norm(x)) for x, al, bl in zip(ms, a, b)]
    return c, a, b, errors


def _split(t: Tensor, first: int, dims: Sequence[int], shapes: Sequence[tuple[int, int]], last: int) -> list[Tensor]:
    """Exact TT-SVD of ``t`` viewed as ``(first, *dims, last)`` into cores
    ``(r_{k−1}, i_k, j_k, r_k)`` with ``r_0 = first`` and the final bond ``last``."""
    cores, rest, r = [], t.reshape(first, -1), first
    for k, (i, j) in enumerate(shapes[:-1]):
        u, s, vh = torch.linalg.svd(rest.reshape(r * dims[k], -1), full_matrices=False)
        cores.append(u.reshape(r, i, j, -1))
        r = u.shape[1]
        rest = s[:, None] * vh
    i, j = shapes[-1]
    cores.append(rest.reshape(r, i, j, last))
    return cores


def _split_right(t: Tensor, first: int, dims: Sequence[int], shapes: Sequence[tuple[int, int]]) -> list[Tensor]:
    """The right auxiliary cores of ``B_l`` (``first = r_right`` rows, orthonormal): :func:`_split`,
    then the right-to-left QR sweep of :func:`~lmdecomp.mpo.decompose._gauge_to_centre` down to the
    first of them. The bonds stay those of :func:`_split` (exact ranks are the same from either
    side); every core becomes right-orthonormal, the first one too because ``B_l B_lᵀ = I`` and the
    cores after it already are. With the left cores left-orthonormal (``A_lᵀA_l = I``) this is the
    mixed-canonical form around the shared central tensor ``C``, which carries the norm."""
    return _gauge_to_centre(_split(t, first, dims, shapes, 1), 0)


def _random_aux(core: Tensor, fan_in: int, generator: torch.Generator) -> Tensor:
    return torch.randn(core.shape, generator=generator, dtype=torch.float64) / math.sqrt(fan_in)
