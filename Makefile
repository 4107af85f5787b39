# llm-placement — every target installs what it needs. `make demo` and `make test` are the two
# commands a newcomer runs on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit e2e lint lint-docker typecheck image docker controlplane etcd kwok kueue kustomize helm manifests config-docs system-deps bench soak hostile kind-up kind-e2e kind-down clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## The embedded default: place a bundled five-stage workload on a bundled mixed cluster.
demo: $(STAMP)
	$(BIN)/llm-placement demo

## Everything CI runs: lint, types, unit tests, then the real control plane, helm, Prometheus and
## container suites (tests/integration/test_container.py starts dockerd and builds the image itself).
test: $(STAMP) system-deps controlplane etcd kwok kueue kustomize helm
	$(BIN)/ruff check app testkit kubeharness tests bench scripts
	$(BIN)/mypy app testkit kubeharness
	$(BIN)/pytest -q -p no:cacheprovider tests/unit
	$(BIN)/pytest -q -p no:cacheprovider tests --ignore=tests/unit

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

e2e: $(STAMP) controlplane etcd kwok kueue
	$(BIN)/pytest -q -m integration tests/integration

lint: $(STAMP)
	$(BIN)/ruff check app testkit kubeharness tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy app testkit kubeharness

## Debian packages the suites use (Prometheus + promtool, openssl for the test PKI).
system-deps:
	bash scripts/install-system-deps.sh

## kube-apiserver + kube-scheduler from the official Go modules, cached outside the clone.
controlplane:
	bash scripts/build-controlplane.sh

## etcd 3.6 (the line Kubernetes 1.36 is tested with) from its Go module, cached next to the control plane.
etcd:
	bash scripts/build-etcd.sh >/dev/null

## kwok (fake kubelets for the trace replays) from its Go module, cached next to the control plane.
kwok:
	bash scripts/build-kwok.sh >/dev/null

## Kueue (the all-or-nothing admission baseline of the replays) from its Go module, cached next to the
## control plane with the CRDs and webhook configuration of the same version.
kueue:
	bash scripts/build-kueue.sh >/dev/null

## kustomize (what `kubectl kustomize` embeds) from its Go module, for the example kustomizations.
kustomize:
	bash scripts/build-kustomize.sh >/dev/null

## helm from its Go module, cached outside the clone.
helm:
	bash scripts/build-helm.sh

## Raw manifests in deploy/manifests rendered from the chart.
manifests: $(STAMP) helm
	bash scripts/render-manifests.sh

## docs/configuration.md and the chart's extender.settings schema, from the settings model.
config-docs: $(STAMP)
	$(BIN)/python -m scripts.gen_config_docs

## The extender image from the Dockerfile (tag printed last). Default base: the official python:3.11
## slim image. BASE=debian: a Python 3.11 base made from Debian packages (no registry needed; what CI uses).
image: docker
	bash scripts/build-image.sh $(if $(BASE),--base $(BASE))

## A Docker daemon: Debian's docker.io when none answers, started in the background if not running.
docker:
	bash scripts/install-system-deps.sh
	bash scripts/start-dockerd.sh

lint-docker: $(STAMP)
	$(BIN)/hadolint Dockerfile

## Placement-quality figures come from bench/replay.py (real kube-scheduler + extender on kwok nodes);
## trace_sim.py and data_gravity.py are the simulator's what-if figures.
bench: $(STAMP) controlplane etcd kwok kueue
	$(BIN)/python -m bench.gang_solver --instances 5
	$(BIN)/python bench/extender_latency.py --runs 50
	$(BIN)/python bench/data_gravity.py
	$(BIN)/python -m bench.scheduler_throughput --quick
	@# The trace replays read the public openb trace beside the checkout; without it they are skipped.
	@if [ -d ../shared/data/alibaba-gpu-v2023 ]; then \
	  $(BIN)/python bench/trace_sim.py && \
	  $(BIN)/python -m bench.replay --trace multigpu50 --trace default --sharing skip; \
	else echo "bench: ../shared/data/alibaba-gpu-v2023 not found: openb trace replays skipped"; fi
	@# Outcomes against MostAllocated and real Kueue (BENCHMARKS.md section 4): the LLM-cluster mix at
	@# light, heavy and overload, and the pipeline mixes at heavy and overload.
	$(BIN)/python -m bench.replay --llm-jobs 240 --load 0.5 --load 1.0 --load 1.3 --seed 1 --name s1
	for s in 2 3; do $(BIN)/python -m bench.replay --llm-jobs 240 --load 1.0 --seed $$s --name s$$s || exit 1; done
	$(BIN)/python -m bench.replay --gravity gpu --gravity cpu --gravity gpu-small --pipelines 48 \
	  --load 1.0 --load 1.3 --variants ours --variants mostalloc --variants kueue --variants affinity --name loads
	$(BIN)/python -m bench.replay --gangs 40 --variants ours --variants mostalloc --variants kueue \
	  --variants kueue-tas --name kueue

## Soak with faults: ~3,000 pods of every stage on kwok nodes while the extender, kube-scheduler,
## kube-apiserver and etcd are killed (-9) and restarted; invariants checked throughout
## (kubeharness/soak.py). Figures in bench/results/soak-3000.json and BENCHMARKS.md.
soak: $(STAMP) controlplane etcd kwok
	$(BIN)/python -m bench.soak

## Hostile inputs on the real control plane, with bounds: 800-slice DRA churn (filter p99), 4,000
## incomplete gangs of one tenant (another tenant's bind time), a YAML bomb handed to the planner.
## Figures in bench/results/hostile.json and BENCHMARKS.md; exit 1 when a bound is missed.
hostile: $(STAMP) controlplane etcd
	$(BIN)/python -m bench.hostile

## For laptops with Docker (not exercised in this repository's CI: its Docker refuses privileged
## containers, which kind needs; docs/install.md).
kind-up:
	bash deploy/kind/kind.sh up

kind-e2e:
	bash deploy/kind/kind.sh e2e

kind-down:
	bash deploy/kind/kind.sh down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
