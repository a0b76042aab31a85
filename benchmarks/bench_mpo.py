"""Benchmark lmdecomp.mpo against its references, side by side in one run.

1. Decomposition: all 72 linear weights of a BERT-base-shaped model (12 layers × q, k,
   v, attention-out 768×768, FFN-in 3072×768, FFN-out 768×3072; seeded random float32)
   with :func:`lmdecomp.mpo.mpo_decompose` and with tensorly's ``tensor_train_matrix``
   at the same factorisation and the same ranks (tensorly gets the bond dims ours
   produced), once without truncation and once with ``rel_err``. Each weight is timed
   back to back with every method (minimum over the repeats), so load on the machine
   hits all methods alike. tensorly runs with its default numpy backend (the target) and
   with its pytorch backend (same LAPACK as ours; reported for context).
2. Forward + backward of ``MPOLinear`` against ``nn.Linear`` (768 → 3072) on a
   32 × 128-token batch at full rank and at uniform bond caps keeping ~50 % and ~10 %
   of the weight's parameters, plus one cap at ~0.5 %, about where the contraction
   path's flop estimate meets the dense path's. The input requires grad for both
   modules, as it does for a layer inside a network: otherwise ``nn.Linear`` would skip
   its input-gradient GEMM (a third of its work) and the comparison would be unfair.
   ``MPOLinear`` runs in its default ``auto`` mode (:meth:`MPOLinear.auto_path`, which
   weighs flops and the memory traffic of each path, :meth:`MPOLinear.cost`); the other
   path is timed too when its flop estimate is within 4× of the dense one, so the table
   shows where flops alone would pick the slower path. The modules are timed in PAIRS
   pairs, each side the median of its repeats; within a pair the two modules' calls
   interleave (nn.Linear first in even pairs, MPOLinear first in odd ones), and a ratio is
   taken per pair. The process asks PyTorch for transparent huge pages on large tensors,
   as the pipeline's training scripts do (``workflow/scripts/variant.py``, ``finetune.py``;
   :func:`lmdecomp.models.heap.huge_pages_for_large_tensors`): both modules' W-sized and
   output-sized buffers then cost a page fault per 2 MiB, not per 4 KiB.
3. Memory of training at ~10 % of the parameters (:func:`training_memory`): after one
   AdamW step, the bytes of the parameters, their gradients and the optimizer state
   (``exp_avg``, ``exp_avg_sq``, ``step``) of each module, and the peak of the step
   (forward + backward + ``optimizer.step``) from the profiler's allocation events, on
   top of those persistent bytes (the shared input and output gradient not counted).

Targets (ratios, never absolute times): decomposition at least as fast as tensorly
(numpy backend), errors equal to tensorly's at equal ranks, and at ~10 % of the
parameters MPOLinear's fwd+bwd time ÷ nn.Linear's ≤ 1.1 in every pair and its
parameters + gradients + AdamW state ≤ 12 % of nn.Linear's. Restated on 2026-12-02 from
"faster than nn.Linear", which the arithmetic rules out at this size: the contraction
path costs ~21 × the dense flops at these bonds, and the dense path does nn.Linear's
three GEMMs plus rebuilding ``W`` (and its backward), so at best it ties (see
docs/performance.md). Prints a table, writes JSON (default
``results/benchmarks/mpo.json``) and exits 1 when a target is missed.

Needs tensorly (benchmark only): ``pip install torch==2.13.0 tensorly``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# Both libraries get the same two threads (set before numpy/torch load their BLAS).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")

from lmdecomp.models import heap  # noqa: E402

heap.huge_pages_for_large_tensors()  # before the first tensor, as the training scripts do

import numpy as np  # noqa: E402
import torch  # noqa: E402

from lmdecomp.mpo.decompose import factorize, mpo_decompose  # noqa: E402
from lmdecomp.mpo.layer import MPOLinear  # noqa: E402

THREADS = 2
HIDDEN, FFN, LAYERS = 768, 3072, 12
BERT_SHAPES = [(HIDDEN, HIDDEN)] * 4 + [(FFN, HIDDEN), (HIDDEN, FFN)]
TRUNCATED_REL_ERR = 0.3
ROWS = 32 * 128
PAIRS = 6
TIME_TARGET = 1.1  # MPOLinear fwd+bwd time ÷ nn.Linear's, in every pair, at ~10 % of the parameters
MEMORY_TARGET = 0.12  # MPOLinear params + grads + AdamW state ÷ nn.Linear's, at ~10 %
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "mpo.json"


def import_tensorly():
    try:
        import tensorly
        from tensorly.decomposition import tensor_train_matrix
        from tensorly.tt_matrix import tt_matrix_to_tensor
    except ImportError:
        sys.exit(
            "bench_mpo.py needs tensorly for the decomposition comparison (a benchmark-only "
            "dependency): .venv/bin/pip install torch==2.13.0 tensorly"
        )
    return tensorly, tensor_train_matrix, tt_matrix_to_tensor


def bert_weight(index: int) -> torch.Tensor:
    """Weight ``index`` (0…71) of the BERT-base-shaped model, reproducibly seeded."""
    out_dim, in_dim = BERT_SHAPES[index % len(BERT_SHAPES)]
    g = torch.Generator().manual_seed(1000 + index)
    return torch.randn(out_dim, in_dim, generator=g) / math.sqrt(in_dim)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def rel_error(approx, weight: np.ndarray) -> float:
    approx = np.asarray(approx, dtype=np.float64).reshape(weight.shape)
    return float(np.linalg.norm(approx - weight) / np.linalg.norm(weight))


def bench_decomposition(repeats: int) -> dict:
    tensorly, tensor_train_matrix, tt_matrix_to_tensor = import_tensorly()
    results = {}
    for label, rel_err in (("full_rank", None), (f"rel_err_{TRUNCATED_REL_ERR}", TRUNCATED_REL_ERR)):
        times = {"ours": 0.0, "tensorly_numpy": 0.0, "tensorly_pytorch": 0.0}
        errors = {name: [] for name in times}
        params, dense_params = 0, 0
        for index in range(LAYERS * len(BERT_SHAPES)):
            weight = bert_weight(index)
            out_shape, in_shape = factorize(weight.shape[0]), factorize(weight.shape[1])
            tensorized = weight.reshape(out_shape + in_shape)
            best = dict.fromkeys(times, math.inf)
            for _ in range(repeats):
                seconds, mpo = timed(lambda: mpo_decompose(weight, out_shape, in_shape, rel_err=rel_err))
                best["ours"] = min(best["ours"], seconds)
                ranks = mpo.bond_dims
                tensorly.set_backend("numpy")
                seconds, tt_np = timed(lambda: tensor_train_matrix(tensorized.numpy(), list(ranks)))
                best["tensorly_numpy"] = min(best["tensorly_numpy"], seconds)
                tensorly.set_backend("pytorch")
                seconds, tt_pt = timed(lambda: tensor_train_matrix(tensorized, list(ranks)))
                best["tensorly_pytorch"] = min(best["tensorly_pytorch"], seconds)
            for name in times:
                times[name] += best[name]
            dense = weight.double().numpy()
            errors["ours"].append(rel_error(mpo.to_matrix().numpy(), dense))
            tensorly.set_backend("numpy")
            errors["tensorly_numpy"].append(rel_error(tt_matrix_to_tensor(tt_np), dense))
            tensorly.set_backend("pytorch")
            errors["tensorly_pytorch"].append(rel_error(tt_matrix_to_tensor(tt_pt).numpy(), dense))
            assert [f.shape[-1] for f in tt_np.factors] == ranks[1:], "tensorly did not use the given ranks"
            params += mpo.num_params
            dense_params += weight.numel()
        tensorly.set_backend("numpy")
        results[label] = {
            "rel_err_budget": rel_err,
            "weights": LAYERS * len(BERT_SHAPES),
            "seconds": times,
            "speedup_vs_tensorly_numpy": times["tensorly_numpy"] / times["ours"],
            "speedup_vs_tensorly_pytorch": times["tensorly_pytorch"] / times["ours"],
            "mean_rel_error": {name: statistics.fmean(errs) for name, errs in errors.items()},
            "max_rel_error": {name: max(errs) for name, errs in errors.items()},
            "param_fraction": params / dense_params,
        }
        print(f"decomposition {label}: " + ", ".join(f"{k} {v:.2f}s" for k, v in times.items()), flush=True)
    return results


def bond_cap_for_fraction(weight: torch.Tensor, fraction: float) -> int:
    """The uniform bond cap whose MPO parameter count is closest to ``fraction`` of the
    dense count (counted from the full-rank bond dims, no decomposition needed)."""
    out_shape, in_shape = factorize(weight.shape[0]), factorize(weight.shape[1])
    dims = [o * i for o, i in zip(out_shape, in_shape)]
    full = [1] + [min(math.prod(dims[:k]), math.prod(dims[k:])) for k in range(1, len(dims))] + [1]

    def params(cap: int) -> int:
        r = [min(cap, f) for f in full]
        return sum(r[k] * dims[k] * r[k + 1] for k in range(len(dims)))

    return min(range(1, max(full) + 1), key=lambda cap: abs(params(cap) - fraction * weight.numel()))


def fwd_bwd_seconds(module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> float:
    """Seconds of one forward + backward; ``x`` requires grad, so the input gradient is part
    of the backward."""
    module.zero_grad(set_to_none=True)
    x.grad = None
    start = time.perf_counter()
    module(x).backward(grad)
    return time.perf_counter() - start


def time_fwd_bwd(module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, repeats: int) -> float:
    """Median seconds of one forward + backward, after one warm-up call."""
    fwd_bwd_seconds(module, x, grad)
    return statistics.median(fwd_bwd_seconds(module, x, grad) for _ in range(repeats))


def timed_pairs(dense: torch.nn.Module, layer: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor,
                repeats: int) -> tuple[list[float], list[float]]:
    """PAIRS (nn.Linear, MPOLinear) timings, each side the median of ``repeats`` calls. Within
    a pair the two modules' calls interleave (A B A B …, the order alternating from pair to
    pair), so a drift of the host's speed during the pair reaches both sides alike. Timing
    all of one module's repeats and then the other's let a drift of a few seconds decide the
    pair: on the idle AMD EPYC of 2026-12-05, the worst of 10 such pairs was 1.15, 1.83 and
    1.16 in three runs, against 1.08 and 1.11 interleaved (medians 0.99–1.08 and 1.06)."""
    t_dense, t_layer = [], []
    for module in (dense, layer):  # warm-up
        fwd_bwd_seconds(module, x, grad)
    for pair in range(PAIRS):
        order = (dense, layer) if pair % 2 == 0 else (layer, dense)
        samples: dict[int, list[float]] = {id(m): [] for m in order}
        for _ in range(repeats):
            for module in order:
                samples[id(module)].append(fwd_bwd_seconds(module, x, grad))
        t_dense.append(statistics.median(samples[id(dense)]))
        t_layer.append(statistics.median(samples[id(layer)]))
    return t_dense, t_layer


def rebuild_seconds(layer: MPOLinear, repeats: int) -> float:
    """Median seconds of rebuilding ``W`` from the cores plus its backward: the dense path's
    work beyond nn.Linear's three GEMMs."""
    samples = []
    grad_w = torch.randn(layer.out_features, layer.in_features)
    for step in range(repeats + 1):
        layer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        layer.weight().backward(grad_w)
        if step:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def training_memory(module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> dict:
    """Bytes one AdamW training step keeps, and its peak (see the module docstring).

    persistent = params + their .grad + every tensor in optimizer.state after one step.
    peak_step = persistent bytes live before the step (grads zeroed to None) + the highest
    running sum of the profiler's allocation (+) and free (−) events during the second step."""
    from torch.profiler import ProfilerActivity, profile

    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        x.grad = None
        module(x).backward(grad)
        opt.step()

    step()
    params = list(module.parameters())
    out = {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
           "optimizer_state": tensor_bytes(v for st in opt.state.values() for v in st.values())}
    out["persistent"] = out["params"] + out["grads"] + out["optimizer_state"]
    opt.zero_grad(set_to_none=True)
    x.grad = None
    before = out["params"] + out["optimizer_state"]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        module(x).backward(grad)
        opt.step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    running = high = 0
    for e in events:
        running += e.nbytes()
        high = max(high, running)
    out["peak_step"] = before + high
    x.grad = None
    return out


def bench_memory(fraction: float = 0.1) -> dict:
    """:func:`training_memory` of nn.Linear (768 → 3072) and of MPOLinear at ~``fraction``."""
    torch.manual_seed(0)
    dense = torch.nn.Linear(HIDDEN, FFN)
    layer = MPOLinear.from_linear(dense, max_bond=bond_cap_for_fraction(dense.weight, fraction))
    x = torch.randn(32, 128, HIDDEN, requires_grad=True)
    grad = torch.randn(32, 128, FFN)
    result = {"nn_linear": training_memory(dense, x, grad), "mpo": training_memory(layer, x, grad),
              "param_fraction": layer.num_params / dense.weight.numel(), "bond_dims": list(layer.bond_dims)}
    for key in ("params", "persistent", "peak_step"):
        result[f"{key}_ratio"] = result["mpo"][key] / result["nn_linear"][key]
    print(f"memory ~{fraction:.0%}: persistent {result['mpo']['persistent'] / 2**20:.2f} vs "
          f"{result['nn_linear']['persistent'] / 2**20:.2f} MiB, peak of a step {result['mpo']['peak_step'] / 2**20:.1f} "
          f"vs {result['nn_linear']['peak_step'] / 2**20:.1f} MiB", flush=True)
    return result


def bench_forward_backward(repeats: int) -> dict:
    torch.manual_seed(0)
    dense = torch.nn.Linear(HIDDEN, FFN)
    x = torch.randn(32, 128, HIDDEN, requires_grad=True)  # as inside a network: dL/dx is computed
    grad = torch.randn(32, 128, FFN)
    points = {"full_rank": None}
    for name, fraction in (("params_50pct", 0.5), ("params_10pct", 0.1), ("params_0.5pct", 0.005)):
        points[name] = bond_cap_for_fraction(dense.weight, fraction)
    results = {}
    for name, cap in points.items():
        layer = MPOLinear.from_linear(dense, max_bond=cap)
        flops, cost = layer.flops(ROWS), layer.cost(ROWS)
        auto_path = layer.auto_path(ROWS)
        entry = {
            "max_bond": cap,
            "bond_dims": list(layer.bond_dims),
            "param_fraction": layer.num_params / dense.weight.numel(),
            "est_flops_contract_over_dense": flops["contract"] / flops["dense"],
            "est_cost_contract_over_dense": cost["contract"] / cost["dense"],
            "auto_path": auto_path,
        }
        t_dense, t_auto = timed_pairs(dense, layer, x, grad, repeats)
        entry["seconds_nn_linear"] = statistics.median(t_dense)
        entry["seconds_mpo_auto"] = statistics.median(t_auto)
        entry["speedup_pairs"] = [d / a for d, a in zip(t_dense, t_auto)]
        entry["speedup_auto_vs_dense"] = statistics.median(entry["speedup_pairs"])
        entry["time_ratio_pairs"] = [a / d for d, a in zip(t_dense, t_auto)]  # MPOLinear ÷ nn.Linear
        for mode in ("contract", "dense"):
            if mode == auto_path:
                continue
            if mode == "contract" and flops["contract"] > 4 * flops["dense"]:
                entry["seconds_mpo_contract"] = None  # skipped: estimated > 4x the dense flops
                continue
            layer.forward_mode = mode
            entry[f"seconds_mpo_{mode}"] = time_fwd_bwd(layer, x, grad, repeats)
        layer.forward_mode = "auto"
        entry[f"seconds_mpo_{auto_path}"] = entry["seconds_mpo_auto"]
        entry["seconds_rebuild_w"] = rebuild_seconds(layer, repeats)
        results[name] = entry
        print(
            f"fwd+bwd {name}: bonds {entry['bond_dims']}, {entry['param_fraction']:.3f} of params, "
            f"auto={auto_path}, nn.Linear {entry['seconds_nn_linear']:.3f}s, MPO {entry['seconds_mpo_auto']:.3f}s",
            flush=True,
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 decomposition repeat and 3 timing repeats")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    decomp_repeats, fb_repeats = (1, 3) if args.quick else (2, 8)
    torch.set_num_threads(THREADS)
    import_tensorly()  # fail before any work when it is missing

    decomposition = bench_decomposition(decomp_repeats)
    forward_backward = bench_forward_backward(fb_repeats)
    memory = bench_memory()

    targets = []
    for label, res in decomposition.items():
        targets.append((f"decompose {label}: tensorly(numpy) time / ours", ">= 1.0", res["speedup_vs_tensorly_numpy"], res["speedup_vs_tensorly_numpy"] >= 1.0))
        ours, ref = res["max_rel_error"]["ours"], res["max_rel_error"]["tensorly_numpy"]
        similar = (ours <= 1e-5 and ref <= 1e-5) or abs(ours - ref) <= 0.01 * ref
        targets.append((f"decompose {label}: max rel error ours vs tensorly", "both <=1e-5 or within 1%", f"{ours:.3g} vs {ref:.3g}", similar))
    ten = forward_backward["params_10pct"]
    # must hold in every back-to-back pair, not only in their median
    worst = max(ten["time_ratio_pairs"])
    targets.append(("fwd+bwd ~10% params: MPOLinear time / nn.Linear", f"<= {TIME_TARGET} in every pair",
                    f"{statistics.median(ten['time_ratio_pairs']):.3f} (worst pair {worst:.3f})", worst <= TIME_TARGET))
    targets.append(("~10% params: params+grads+AdamW state, MPO / dense", f"<= {MEMORY_TARGET}",
                    memory["persistent_ratio"], memory["persistent_ratio"] <= MEMORY_TARGET))

    print(f"\n{'target':<58} {'wanted':<26} {'measured':<22} result")
    for name, wanted, measured, ok in targets:
        shown = f"{measured:.3f}" if isinstance(measured, float) else measured
        print(f"{name:<58} {wanted:<26} {shown:<22} {'PASS' if ok else 'FAIL'}")
    print("\nfwd+bwd detail (seconds, 32x128 tokens, 768->3072):")
    for name, e in forward_backward.items():
        print(
            f"  {name:<14} bonds {str(e['bond_dims']):<28} params {e['param_fraction']:.3f}  "
            f"flops contract/dense {e['est_flops_contract_over_dense']:8.2f}  cost {e['est_cost_contract_over_dense']:8.2f}  "
            f"nn.Linear {e['seconds_nn_linear']:.3f}  "
            f"dense path {e.get('seconds_mpo_dense') or float('nan'):.3f}  contract path {e.get('seconds_mpo_contract') or float('nan'):.3f}  "
            f"rebuild W {e['seconds_rebuild_w']:.3f}  pairs MPO/nn.Linear {', '.join(f'{r:.3f}' for r in e['time_ratio_pairs'])}"
        )
    mib = {k: {m: v / 2**20 for m, v in memory[k].items()} for k in ("nn_linear", "mpo")}
    print(f"\nmemory at ~10% params (MiB; bonds {memory['bond_dims']}, {memory['param_fraction']:.3f} of the weight):")
    for key in ("params", "grads", "optimizer_state", "persistent", "peak_step"):
        print(f"  {key:<16} nn.Linear {mib['nn_linear'][key]:8.3f}  MPOLinear {mib['mpo'][key]:8.3f}  "
              f"ratio {memory['mpo'][key] / memory['nn_linear'][key]:.4f}")

    report = {
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "tensorly": import_tensorly()[0].__version__,
            "numpy": np.__version__,
            "threads": THREADS,
            "cpu_count": os.cpu_count(),
            "quick": args.quick,
            "decomposition_repeats": decomp_repeats,
            "fwd_bwd_repeats": fb_repeats,
            "pairs": PAIRS,
            "thp_mem_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE"),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "load_average": os.getloadavg(),
        },
        "decomposition": decomposition,
        "forward_backward": forward_backward,
        "memory_10pct": memory,
        "targets": [{"name": n, "target": w, "measured": m, "pass": ok} for n, w, m, ok in targets],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0 if all(ok for *_, ok in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
