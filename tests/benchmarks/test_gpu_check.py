"""benchmarks/gpu_check.py's report: which results pass, and that a failed or missing piece fails
the run (the GPU pieces themselves run only on a lent GPU machine, see docs/performance.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def results(identical=True, val_after=5.0):
    peak = {"bf16_tflops": 800.0, "fp32_tflops": 50.0}
    embed = {"runs": {"float32": {"byte_identical": identical, "tokens_per_s": 1e6, "tflops": 25.0}}}
    pretrain = {"recipes": {"zoo": {"initial_val_loss": 6.9, "val_loss": val_after, "tokens_per_s": 2e5,
                                    "tflops": 80.0, "loss_falls": val_after < 6.9}}}
    return peak, embed, pretrain


def write(folder: Path, peak, embed, pretrain) -> None:
    for name, value in (("peak", peak), ("embed", embed), ("pretrain", pretrain)):
        if value is not None:
            (folder / f"{name}.json").write_text(json.dumps(value))


def test_passing_results_pass_and_report_their_share_of_the_peak(gpu_check, tmp_path):
    write(tmp_path, *results())
    assert gpu_check.main(["report", "--out", str(tmp_path)]) == 0
    checks = {c["check"]: c for c in json.loads((tmp_path / "summary.json").read_text())["checks"]}
    assert "50.0% of fp32 peak" in checks["embed float32 tokens/s"]["measured"]  # 25 / 50 TFLOP/s
    assert "10.0% of bf16 peak" in checks["pretrain zoo tokens/s"]["measured"]  # 80 / 800 TFLOP/s


@pytest.mark.parametrize("broken", ["not identical", "loss rose", "no pretrain result"])
def test_a_failed_or_missing_piece_fails_the_run(gpu_check, tmp_path, broken):
    peak, embed, pretrain = results(identical=broken != "not identical", val_after=7.2 if broken == "loss rose" else 5.0)
    write(tmp_path, peak, embed, None if broken == "no pretrain result" else pretrain)
    assert gpu_check.main(["report", "--out", str(tmp_path)]) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pass"] is False
    assert sum(not c["pass"] for c in summary["checks"]) == 1
