"""Snakemake never runs more threads at once than --cores: with 9.10–9.16 (snakemake#3913) the
default run started three one-thread jobs on two cores, and the case below started two 2-thread
jobs side by side (docs/performance.md)."""

from __future__ import annotations

import pytest

from test_workflow import run

pytestmark = pytest.mark.integration

# snakemake#3913's case: two jobs that each claim every core become ready when a first job
# finishes; they must run one after the other.
SNAKEFILE = """
rule final:
    input: "file1", "file2"
rule prepare:
    output: "common"
    threads: 2
    shell: "touch {output}"
rule claim_all_cores:
    input: "common"
    output: "file{number}"
    threads: 2
    shell: "date +%s.%N > {output}; sleep 2; date +%s.%N >> {output}"
"""


def test_jobs_that_claim_every_core_never_overlap(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    run(["snakemake", "--cores", "2"], tmp_path)
    spans = sorted(tuple(float(t) for t in (tmp_path / f"file{i}").read_text().split()) for i in (1, 2))
    (_, end_1), (start_2, _) = spans
    assert end_1 <= start_2, f"two 2-thread jobs ran side by side on 2 cores: {spans}"
