# The FlashAttention textbook. Two commands do everything on a fresh machine:
#   make lab    create the environment if needed, then open JupyterLab on chapters/
#   make test   create the environment if needed, then lint, unit tests and every notebook
# See README.md for the rest (GPU runners, wheelhouse, benchmarks, progress).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
# Test workers: one per core, at most 16.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 16 ? 16 : n )))
# On a GPU runner the chapters run beside the unit tests, on NB_JOBS of the JOBS workers.
NB_JOBS ?= 4
# how the unit tests share the workers (see the comment above 'test')
UNIT_DIST := --dist worksteal
REQS := requirements.txt
# Lines tagged "compute" in requirements.txt come from a GPU runner's own image.
COMPUTE := '^(torch|triton|numpy)=='
# Pins a GPU runner does not need: the browser tests (no Chromium there) and the website's tools
# (the site is built on the CPU machine; they would add 34 MB to the wheelhouse).
NOT_ON_RUNNER := '^(jupyterlab|playwright|sphinx|myst-nb|myst-parser|sphinx-book-theme|pydata-sphinx-theme|jupyter-server-mathjax)=='
WHEELHOUSE := .wheelhouse
GPU_SITE := .gpu-site

# A GPU runner is a machine whose $(PYTHON) already has CUDA torch and triton and sees a GPU.
# There we use that interpreter (plus offline wheels) instead of building a CPU venv.
GPU_PY := $(shell $(PYTHON) -c "import torch, triton, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 && echo $(PYTHON))

ifeq ($(GPU_PY),)
  PY := $(VENV)/bin/python
  READY := $(VENV)/.ready
else
  PY := $(GPU_PY)
  READY := $(GPU_SITE)/.ready
  export PYTHONPATH := $(CURDIR)/$(GPU_SITE):$(CURDIR)
endif

# Notebooks run headless in tests: widgets draw their static figure (flashtext.widgets.base), and
# on a GPU the chapters show the H200 recordings instead of timing a GPU the tests share
# (flashtext.measure_live).
TEST_ENV := FLASHTEXT_STATIC=1 FLASHTEXT_MEASURE=recorded PYTHONHASHSEED=0 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

.PHONY: help env lab test test-fast lint notebooks progress bench bench-quick wheelhouse \
        test-browser test-browser-if-possible book test-book test-book-if-possible \
        record-accuracy clean

help:
	@echo "Reading the book"
	@echo "  make lab              open the book in JupyterLab (creates the environment first)"
	@echo "  make progress         which exercises you have done"
	@echo "  make book             build the book as an offline website in build/book/ (open index.html)"
	@echo "Testing"
	@echo "  make test             lint + unit tests + every notebook under nbval (+ browser test if chromium)"
	@echo "  make test-fast        unit tests only (no lint, no notebooks)"
	@echo "  make lint             ruff over flashtext, solutions, tests, tools, scripts, chapters"
	@echo "  make test-browser     run every chapter in real JupyterLab in headless Chromium"
	@echo "  make test-browser-if-possible  the browser test where chromium and playwright exist, else a note"
	@echo "  make test-book        build the website, then open every page in headless Chromium, offline"
	@echo "  make test-book-if-possible     the website test where chromium and playwright exist, else a note"
	@echo "Measuring (GPU)"
	@echo "  make bench            benchmark the kernel against SDPA/FlexAttention (BENCH_ARGS=...; CPU: quick check)"
	@echo "  make bench-quick      the benchmark's CPU smoke test: tiny shapes, no timing claims"
	@echo "  make record-accuracy  the kernels' correctness sweep against float64 -> flashtext/data/accuracy_*.json"
	@echo "Authors and runners"
	@echo "  make env              create the environment (.venv, or .gpu-site on a GPU runner) if missing"
	@echo "  make notebooks        re-execute every chapter in place (NB=chapters/NN_x.ipynb for one)"
	@echo "  make wheelhouse       gather wheels for an offline GPU runner (run where pip has network)"
	@echo "  make clean            remove the environment, caches and artifacts/"
	@echo "  make help             this list"

env: $(READY)

# CPU path: a venv with the pinned stack (CPU torch), flashtext editable, and the interpreter hook.
$(VENV)/.ready: $(REQS) pyproject.toml
	@$(PYTHON) -c "import sys; sys.exit(0 if sys.version_info >= (3, 11) else 'flashtext needs Python 3.11+, found ' + sys.version.split()[0])"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -r $(REQS)
	$(VENV)/bin/python -m pip install -q --no-deps -e .
	$(VENV)/bin/python -m flashtext._install_hook
	@touch $@

# GPU path: the runner has torch/triton/numpy; add the rest from the wheelhouse, offline.
$(GPU_SITE)/.ready: $(REQS)
	@test -d $(WHEELHOUSE) || { echo "No $(WHEELHOUSE)/: run 'make wheelhouse' on a machine with network and copy it here."; exit 1; }
	rm -rf $(GPU_SITE)
	$(PY) -m pip install -q --no-index --no-deps --no-compile --target $(GPU_SITE) $(WHEELHOUSE)/*.whl
	@touch $@

lab: env
	$(PY) -m jupyter lab --notebook-dir=chapters $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

lint: env
	$(PY) -m ruff check flashtext solutions tests tools scripts chapters

# Unit tests are handed out one by one (no long module holds a worker), and a worker that runs
# dry steals queued tests from a busy one: plain '--dist load' queues a batch on every worker at
# the start and never takes it back, so on the H200 the last four minutes of GPU sweeps ran on
# fewer and fewer of the 12 workers, the final 100 s on one. A notebook's cells must run in order
# in one kernel, so chapters go out a file at a time. On a CPU machine the two run one after the
# other. On a GPU runner most of the unit tests' time is Triton compiling kernels on the host's
# cores while the chapters' cells mostly wait on the GPU, so the chapters run beside the unit
# tests and their report follows the unit tests' (also in artifacts/).
test: env lint
ifeq ($(GPU_PY),)
	$(TEST_ENV) $(PY) -m pytest -n $(JOBS) $(UNIT_DIST) tests
	$(TEST_ENV) $(PY) -m pytest -n $(JOBS) --dist loadfile --nbval-lax --nbval-current-env chapters
else
	@mkdir -p artifacts
	@chapters=0; unit=0; \
	$(TEST_ENV) $(PY) -m pytest -n $(NB_JOBS) --dist loadfile --nbval-lax --nbval-current-env \
	    chapters >artifacts/chapters.log 2>&1 & pid=$$!; \
	$(TEST_ENV) $(PY) -m pytest -n $$(( $(JOBS) > $(NB_JOBS) ? $(JOBS) - $(NB_JOBS) : 1 )) $(UNIT_DIST) tests || unit=$$?; \
	wait $$pid || chapters=$$?; \
	echo "---- chapters, run beside the unit tests (artifacts/chapters.log):"; \
	cat artifacts/chapters.log; \
	exit $$(( unit || chapters ))
endif
	@$(MAKE) --no-print-directory test-browser-if-possible
	@$(MAKE) --no-print-directory test-book-if-possible

test-fast: env
	$(TEST_ENV) $(PY) -m pytest -n $(JOBS) $(UNIT_DIST) tests

test-browser-if-possible:
	@if command -v chromium >/dev/null 2>&1 && $(PY) -c "import playwright" 2>/dev/null; then \
	    $(MAKE) --no-print-directory test-browser; \
	else echo "Browser test SKIPPED: chromium or playwright not installed (see README, 'make test-browser')."; fi

test-browser: env
	$(PY) -m pytest -p no:xdist tools/browser_test.py -v

# The website: chapters/*.ipynb with their stored outputs (never re-executed), by Sphinx.
book: env
	$(PY) tools/book/build.py

test-book: book
	$(PY) -m pytest -p no:xdist tools/book_test.py -v

test-book-if-possible:
	@if command -v chromium >/dev/null 2>&1 && $(PY) -c "import playwright" 2>/dev/null; then \
	    $(MAKE) --no-print-directory test-book; \
	else echo "Website test SKIPPED: chromium or playwright not installed (see README, 'make test-book')."; fi

notebooks: env
	$(TEST_ENV) $(PY) tools/execute_notebooks.py $(or $(NB),chapters/*.ipynb)

progress: env
	@$(PY) -m flashtext.exercises.progress

bench: env
	$(PY) -m flashtext.bench $(BENCH_ARGS)

bench-quick: env
	$(PY) -m flashtext.bench --quick

record-accuracy: env
	$(PY) scripts/record_accuracy.py

# Wheels an offline GPU runner lacks (Python 3.12, manylinux x86_64): everything in
# requirements.txt except the compute stack the runner brings and NOT_ON_RUNNER, with their
# dependencies.
wheelhouse:
	rm -rf $(WHEELHOUSE) && mkdir -p $(WHEELHOUSE)
	grep -vE $(COMPUTE) $(REQS) | grep -vE $(NOT_ON_RUNNER) | sed 's/#.*//' | grep . > $(WHEELHOUSE)/requirements.txt
	$(PYTHON) -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	    --platform manylinux2014_x86_64 --platform any \
	    -d $(WHEELHOUSE) -r $(WHEELHOUSE)/requirements.txt
	# never shadow the runner's own compute stack; debugpy and jedi are optional at run time
	# (ipykernel's debugger, IPython's completer) and drop 10 MB from what travels to the runner
	rm -f $(WHEELHOUSE)/torch-*.whl $(WHEELHOUSE)/triton-*.whl $(WHEELHOUSE)/numpy-*.whl \
	    $(WHEELHOUSE)/nvidia_*.whl $(WHEELHOUSE)/debugpy-*.whl $(WHEELHOUSE)/jedi-*.whl
	@du -sh $(WHEELHOUSE)

clean:
	rm -rf $(VENV) $(GPU_SITE) .pytest_cache .ruff_cache artifacts \
	    build/book build/book-src build/book-doctrees
