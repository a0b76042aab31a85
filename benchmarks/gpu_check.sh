#!/usr/bin/env bash
# GPU check for a lent GPU machine (issue #24 item 4; CI never runs it). Under 8 minutes on one
# NVIDIA GPU (each piece has its own time limit below):
#   1. peak      bf16 (and float32) matmul peak of the GPU, 8192³
#   2. embed     MiniLM embeddings on CUDA twice per dtype (float32, bfloat16): byte-identical?
#   3. pretrain  a few hundred bf16-autocast MLM steps of two zoo recipes: does the loss fall?
#                tokens/s and their share of the bf16 peak
#   4. report    table + results/benchmarks/gpu_check/summary.{json,txt}; exit 1 on a failed check
# Exits 2 with "no CUDA device" when torch sees no GPU. Record the results in docs/performance.md.
#
# Usage:  bash benchmarks/gpu_check.sh                     (results/benchmarks/gpu_check/)
#         bash benchmarks/gpu_check.sh --out DIR
#         bash benchmarks/gpu_check.sh --device cpu --tiny   (the logic at a toy size, on a CPU)
# Python: $PYTHON, else .venv/bin/python, else python3. It needs the repo's venv (make install)
# with a CUDA build of the pinned torch in place of the CPU one, e.g. for CUDA 13.0 drivers:
#   .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
device=cuda tiny="" out="$repo/results/benchmarks/gpu_check"
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --tiny) tiny="--tiny"; shift ;;
    --out) out="$2"; shift 2 ;;
    *) echo "gpu_check.sh: unknown argument $1 (use --device DEV, --tiny, --out DIR)" >&2; exit 2 ;;
  esac
done
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# cuBLAS reads this when a process makes its handle: set before any process's first matmul so
# that deterministic algorithms (embed turns them on for CUDA) are allowed to run
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"

if [[ "$device" == cuda* ]] && ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  "$python" -c 'import torch; print(f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build {torch.version.cuda})")' >&2
  exit 2
fi
mkdir -p "$out"
rm -f "$out"/{peak,embed,pretrain,summary}.json "$out/summary.txt"
rm -rf "$out/embed_work"

status=0
run_piece() {  # piece, seconds: a failed or timed-out piece leaves no JSON, so the report fails it
  local start=$SECONDS
  timeout "$2" "$python" benchmarks/gpu_check.py "$1" --device "$device" $tiny --out "$out" \
    || { echo "gpu_check: $1 failed or ran past $2 s (exit $?)" >&2; status=1; }
  echo "gpu_check: $1 took $((SECONDS - start)) s"
}
run_piece peak 60
run_piece embed 180
run_piece pretrain 200
"$python" benchmarks/gpu_check.py report --out "$out" || status=1
exit $status
