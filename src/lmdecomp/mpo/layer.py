"""The MPO linear layer: a trainable ``nn.Module`` holding an :class:`~lmdecomp.mpo.decompose.MPO`'s
cores, applied by contracting the input through the cores or by rebuilding the dense weight,
whichever :meth:`MPOLinear.auto_path` estimates is cheaper."""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmdecomp.mpo.decompose import (
    MPO,
    _rebuild_costs,
    _rebuild_elements,
    _rebuild_split,
    contract_cores,
    mpo_decompose,
)


def _contract_elements(out_shape: Sequence[int], in_shape: Sequence[int], bond_dims: Sequence[int], left_to_right: bool) -> int:
    """Per-row elements the contraction sweep writes: the sum over the steps of the size
    of each step's output, ``Σ_k (∏_{m≤k} i_m) r_k (∏_{m>k} j_m)`` left to right and
    ``Σ_k (∏_{m<k} j_m) r_{k−1} (∏_{m≥k} i_m)`` right to left."""
    n = len(out_shape)
    if left_to_right:
        return sum(math.prod(out_shape[: k + 1]) * bond_dims[k + 1] * math.prod(in_shape[k + 1 :]) for k in range(n))
    return sum(math.prod(in_shape[:k]) * bond_dims[k] * math.prod(out_shape[k:]) for k in range(n))


def _linear_costs(
    out_shape: Sequence[int], in_shape: Sequence[int], bond_dims: Sequence[int]
) -> tuple[int, int, int]:
    """Per-row multiply-adds of the left-to-right and right-to-left core sweeps, and the
    (row-independent) multiply-adds of rebuilding the dense weight with
    :func:`contract_cores` at its cheapest split (:func:`_rebuild_costs`)."""
    n = len(out_shape)
    core_sizes = [bond_dims[k] * out_shape[k] * in_shape[k] * bond_dims[k + 1] for k in range(n)]
    ltr = sum(math.prod(out_shape[:k]) * math.prod(in_shape[k + 1 :]) * core_sizes[k] for k in range(n))
    rtl = sum(math.prod(in_shape[:k]) * math.prod(out_shape[k + 1 :]) * core_sizes[k] for k in range(n))
    return ltr, rtl, min(_rebuild_costs(out_shape, in_shape, bond_dims))


class MPOLinear(nn.Module):
    """``y = x Wᵀ + b`` with ``W`` held as trainable MPO cores (``cores.0 … cores.{n−1}``).

    Two forward paths give the same result:

    ``"contract"``
        applies the cores to the input one at a time without forming ``W``. Going left
        to right, the input (``rows × I``) is viewed as ``(rows·∏_{m<k} i_m, r_{k−1} j_k,
        ∏_{m>k} j_m)`` and multiplied by core ``k`` as an ``(i_k r_k, r_{k−1} j_k)``
        matrix; the result is already laid out for step ``k+1``, so no permutes are
        needed. Cost ``2·rows·Σ_k (∏_{m<k} i_m)(∏_{m>k} j_m)|G_k|`` flops; the mirrored
        right-to-left sweep costs ``2·rows·Σ_k (∏_{m<k} j_m)(∏_{m>k} i_m)|G_k|`` and the
        cheaper direction is used.
    ``"dense"``
        rebuilds ``W`` with :func:`contract_cores` (``2·min_s cost(s)`` flops, see
        :func:`_rebuild_costs`) and calls ``F.linear`` (``2·rows·O·I`` flops).

    ``forward_mode="auto"`` (the default) picks the path of smaller estimated cost
    (:meth:`cost`, in flop-equivalents) for the number of input rows; set it to
    ``"contract"`` or ``"dense"`` to force one::

        cost_contract = 2·rows·Σ_k (…)|G_k| + β_c·rows·Σ_k |T_k|
        cost_dense    = 2·(rebuild + rows·O·I) + β_r·E_rebuild

    where ``|T_k|`` is the per-row size of contraction step ``k``'s output
    (:func:`_contract_elements`), ``E_rebuild`` the elements :func:`contract_cores`
    writes (:func:`_rebuild_elements`), ``β_c =`` :attr:`CONTRACT_ELEMENT_COST` and
    ``β_r =`` :attr:`REBUILD_ELEMENT_COST`. Flops alone mislead: each contraction step is
    a batched product of many tiny matrices, which runs at memory speed (768 → 3072 at
    bond 10 and 4096 rows: flop estimate 0.83 of the dense path, time 7×), and the
    rebuild is dominated by writing and permuting ``O·I``-sized intermediates. The
    constants are ``(t·R − flops) / elements`` with ``R`` the dense path's GEMM rate,
    fitted from forward + backward timings of 768 → 3072 at bonds 2, 4 and 10, 1-4096
    rows, the input requiring grad, 1 and 2 threads: ``β_r`` ≈ 35-100 (75 taken);
    ``β_c`` ≈ 130-260 while the sweep's intermediates stay in cache and ≈ 450-540 from
    ~1000 rows on, when they do not (480 taken). The out-of-cache ``β_c`` makes the
    estimate err towards the dense path, which is GEMM-bound and predictable: in these
    timings a wrong ``"dense"`` costs at most 1.9×, while a wrong ``"contract"`` cost up
    to 7× before. Measured (2 threads, min of 3-15 repeats), seconds contract / dense
    and the auto choice:

    ====  ========================  ========================  =======================  ====================
    bond  4 rows                    64 rows                   256 rows                 4096 rows
    ====  ========================  ========================  =======================  ====================
    2     0.00093 / 0.0094 contr.   0.0038 / 0.010 contr.     0.013 / 0.025 dense      0.42 / 0.30 dense
    4     0.0014 / 0.010 contr.     0.0072 / 0.013 dense      0.026 / 0.027 dense      0.89 / 0.31 dense
    10    0.0021 / 0.0072 contr.    0.016 / 0.013 dense       0.060 / 0.027 dense      2.3 / 0.32 dense
    ====  ========================  ========================  =======================  ====================

    ``"contract"`` is chosen up to 173 rows at bond 2, 48 at bond 4 and 15 at bond 10
    (3072 × 768); the measured misses are bond 4 at 64 rows and bond 2 at 256-1024 rows
    (contract 1.4-1.9× faster there).
    """

    FORWARD_MODES = ("auto", "contract", "dense")
    #: flop-equivalents per element a contraction step writes (β_c above; measured).
    CONTRACT_ELEMENT_COST = 480
    #: flop-equivalents per element the dense path's rebuild writes (β_r above; measured).
    REBUILD_ELEMENT_COST = 75

    def __init__(
        self,
        out_shape: Sequence[int],
        in_shape: Sequence[int],
        bond_dims: Sequence[int],
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.out_shape = tuple(int(d) for d in out_shape)
        self.in_shape = tuple(int(d) for d in in_shape)
        self.bond_dims = tuple(int(r) for r in bond_dims)
        n = len(self.out_shape)
        if len(self.in_shape) != n or len(self.bond_dims) != n + 1:
            raise ValueError(f"need n out factors, n in factors and n+1 bond dims; got {out_shape}, {in_shape}, {bond_dims}")
        if self.bond_dims[0] != 1 or self.bond_dims[-1] != 1 or min(self.bond_dims) < 1:
            raise ValueError(f"bond dims must be >= 1 with r_0 = r_n = 1, got {bond_dims}")
        self.out_features = math.prod(self.out_shape)
        self.in_features = math.prod(self.in_shape)
        self.cores = nn.ParameterList(
            nn.Parameter(torch.empty(self.bond_dims[k], self.out_shape[k], self.in_shape[k], self.bond_dims[k + 1], device=device, dtype=dtype))
            for k in range(n)
        )
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.forward_mode = "auto"
        ltr, rtl, self._rebuild_macs = _linear_costs(self.out_shape, self.in_shape, self.bond_dims)
        self._rebuild_split = _rebuild_split(self.out_shape, self.in_shape, self.bond_dims)
        self._rebuild_elements = _rebuild_elements(self.out_shape, self.in_shape, self.bond_dims, self._rebuild_split)
        self._left_to_right = ltr <= rtl
        self._contract_macs = min(ltr, rtl)
        self._contract_elements = _contract_elements(self.out_shape, self.in_shape, self.bond_dims, self._left_to_right)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Gaussian cores scaled so each entry of ``W`` has variance ``1 / in_features``
        (an entry sums ``∏_k r_k`` products of ``n`` core entries); zero bias."""
        n = len(self.cores)
        std = (1.0 / (self.in_features * math.prod(self.bond_dims))) ** (1.0 / (2 * n))
        with torch.no_grad():
            for core in self.cores:
                core.normal_(0.0, std)
            if self.bias is not None:
                self.bias.zero_()

    @classmethod
    def from_mpo(cls, mpo: MPO, bias: Tensor | None = None) -> MPOLinear:
        """A layer whose cores (and bias) are copies of ``mpo.cores`` (and ``bias``)."""
        core0 = mpo.cores[0]
        layer = cls(mpo.out_shape, mpo.in_shape, mpo.bond_dims, bias=bias is not None, device=core0.device, dtype=core0.dtype)
        with torch.no_grad():
            for param, core in zip(layer.cores, mpo.cores):
                param.copy_(core)
            if bias is not None:
                layer.bias.copy_(bias)
        return layer

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        shapes: tuple[Sequence[int], Sequence[int]] | None = None,
        max_bond: int | Sequence[int] | None = None,
        rel_err: float | None = None,
        *,
        n_cores: int = 5,
        canonical: str = "mixed",
    ) -> MPOLinear:
        """Decompose ``linear.weight`` with :func:`mpo_decompose` (``shapes`` =
        ``(out_factors, in_factors)``, or automatic with ``n_cores`` factors; ``canonical``
        its gauge: ``"mixed"`` puts the norm in the central core) and keep its bias. The
        SVDs run in float64, so truncation choices and full-rank accuracy do not depend on
        the layer's dtype; the cores are stored in the layer's dtype."""
        out_shape, in_shape = shapes if shapes is not None else (None, None)
        weight = linear.weight.detach()
        mpo = mpo_decompose(weight.double(), out_shape, in_shape, n_cores=n_cores, max_bond=max_bond, rel_err=rel_err,
                            canonical=canonical)
        mpo.cores = [c.to(weight.dtype) for c in mpo.cores]
        bias = linear.bias.detach() if linear.bias is not None else None
        return cls.from_mpo(mpo, bias)

    def weight(self) -> Tensor:
        """The dense weight the cores represent (differentiable)."""
        return contract_cores(list(self.cores), self.out_shape, self.in_shape, self._rebuild_split)

    def to_mpo(self) -> MPO:
        """A detached :class:`MPO` copy of the cores (no spectra)."""
        return MPO([c.detach().clone() for c in self.cores], self.out_shape, self.in_shape)

    @property
    def num_params(self) -> int:
        """Parameters in the cores (bias excluded)."""
        return sum(c.numel() for c in self.cores)

    def flops(self, rows: int) -> dict[str, int]:
        """Estimated forward flops of each path for ``rows`` input rows."""
        return {
            "contract": 2 * rows * self._contract_macs,
            "dense": 2 * (self._rebuild_macs + rows * self.out_features * self.in_features),
        }

    def cost(self, rows: int) -> dict[str, int]:
        """Estimated forward cost of each path in flop-equivalents: :meth:`flops` plus
        the memory terms ``β_c·rows·Σ_k |T_k|`` (contract) and ``β_r·E_rebuild`` (dense),
        see the class docstring."""
        cost = self.flops(rows)
        cost["contract"] += self.CONTRACT_ELEMENT_COST * rows * self._contract_elements
        cost["dense"] += self.REBUILD_ELEMENT_COST * self._rebuild_elements
        return cost

    def auto_path(self, rows: int) -> str:
        """The path ``forward_mode="auto"`` takes for ``rows`` input rows."""
        cost = self.cost(rows)
        return "contract" if cost["contract"] < cost["dense"] else "dense"

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"MPOLinear expects inputs whose last dimension is in_features={self.in_features}, got shape {tuple(x.shape)}")
        rows = x.numel() // self.in_features
        mode = self.forward_mode
        if mode == "auto":
            mode = self.auto_path(rows)
        if mode == "dense":
            return F.linear(x, self.weight(), self.bias)
        if mode != "contract":
            raise ValueError(f"forward_mode must be one of {self.FORWARD_MODES}, got {self.forward_mode!r}")
        y = self._contract(x.reshape(rows, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        return y + self.bias if self.bias is not None else y

    def _contract(self, t: Tensor) -> Tensor:
        n = len(self.cores)
        if self._left_to_right:
            for k, core in enumerate(self.cores):
                r0, i, j, r1 = core.shape
                mat = core.permute(1, 3, 0, 2).reshape(i * r1, r0 * j)
                t = torch.matmul(mat, t.reshape(-1, r0 * j, math.prod(self.in_shape[k + 1 :])))
        else:
            for k in reversed(range(n)):
                r0, i, j, r1 = self.cores[k].shape
                mat = self.cores[k].reshape(r0 * i, j * r1)
                t = torch.matmul(mat, t.reshape(-1, j * r1, math.prod(self.out_shape[k + 1 :])))
        return t.reshape(-1, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"out_shape={self.out_shape}, in_shape={self.in_shape}, bond_dims={self.bond_dims}, "
            f"bias={self.bias is not None}, forward_mode={self.forward_mode!r}"
        )
