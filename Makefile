# RLAX on Beam. `make quickstart` and `make test` work on a fresh machine: each sets up what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
UV_VERSION := 0.13.9
OUTPUT ?= runs/quickstart
# The default lane runs a worker more than the 2 cores: about a third of a worker's time is spent
# waiting (on jobs it started, on polls), which the third fills; worksteal moves the last tests to
# an idle worker (measured idle, one run each: 9:49 with 2 workers, 9:03 with 3 and worksteal; on the
# tree of 2026-12-05, 8:24 with 3 and 8:59 with 4; 6:02 with 3, load average 1.1, once the lane compiled
# with XLA:CPU's elemental fusion emitters). The slow lane's tests start jobs of their own: 2 workers.
TEST_WORKERS ?= 3
# The slow and long lanes compile at XLA's own optimisation level (tests/conftest.py says why).
OPTIMISED_CPU_CODE := RLAX_TEST_UNOPTIMISED_CPU_CODE=0
PYTEST_WORKERS ?= 2
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: quickstart-programs setup setup-run setup-test setup-tpu-compile setup-gpu-compile quickstart test test-slow test-long test-all test-alone test-tpu-compile test-gpu-compile bench lock lock-accelerators worker-image sdist wheel clean

# The virtual environment, from the lock file; Prism and the GCS emulator built from Go modules.
# Bytecode compiled at install (uv does not by default): a process that finds no .pyc compiles every
# module it imports, ~10 s of CPU for Beam + JAX, each time when PYTHONDONTWRITEBYTECODE is set.
$(VENV)/.installed: setup.py requirements/lock.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(UV) || { $(PY) -m pip --version >/dev/null 2>&1 || $(PY) -m ensurepip >/dev/null; \
	  $(PY) -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION); }
	$(UV) pip install --quiet --compile-bytecode -p $(PY) -r requirements/lock.txt
	$(UV) pip install --quiet -p $(PY) --no-deps -e .
	touch $@

# What running the commands needs (the venv and Prism), and what only the tests add (the GCS emulator).
setup-run: $(VENV)/.installed
	bash scripts/setup_prism.sh

setup-test: setup-run
	bash scripts/build_fake_gcs.sh

setup: setup-test

# Set-up compiles the quickstart's programs into JAX's persistent compilation cache (~/.cache/rlax/jax,
# or $RLAX_COMPILATION_CACHE_DIR) with a two-step run in a scratch folder: the filter's, the rollout
# workers' and the evaluations' engine, and the trainer's update for the buckets it compiles ahead. A
# first quickstart then loads them instead of compiling (about 40 s of its 2 minutes on 2 cores). Redone
# when the recipe or the environment changes; `make quickstart-programs` alone does only this.
QUICKSTART_PROGRAMS := $(VENV)/.quickstart-programs
$(QUICKSTART_PROGRAMS): $(VENV)/.installed configs/quickstart.yaml configs/base.yaml
	rm -rf $(VENV)/quickstart-programs
	$(VENV)/bin/rlax quickstart --output $(VENV)/quickstart-programs --filter-prompts 16 trainer.total_steps=2 \
	  > $(VENV)/quickstart-programs.log 2>&1 || { tail -30 $(VENV)/quickstart-programs.log; exit 1; }
	rm -rf $(VENV)/quickstart-programs
	touch $@

quickstart-programs: setup-run $(QUICKSTART_PROGRAMS)

# The main job: curate -> filter -> RL (trainer + streaming rollouts) -> evaluate, on stories260K.
# Refuses a folder that holds another run: `make quickstart OUTPUT=runs/other`, or ARGS=--resume.
quickstart: setup-run $(QUICKSTART_PROGRAMS)
	$(VENV)/bin/rlax quickstart --output $(OUTPUT) $(ARGS)
	@echo "rlax is $(CURDIR)/$(VENV)/bin/rlax (or: source $(VENV)/bin/activate)"

# The default lane: everything but tests marked slow (and the TPU and GPU compile lanes, each in its own environment).
test: setup-test
	$(PY) -m pytest -m "not slow and not tpu and not gpu" -n $(TEST_WORKERS) --dist worksteal --timeout 900 --durations 20 $(PYTEST_ARGS)

# The slow lane: long tests (full HumanEval, multi-process stress, end-to-end runs), less the long ones.
test-slow: setup-test
	$(OPTIMISED_CPU_CODE) $(PY) -m pytest -m "slow and not long and not tpu and not gpu" -n $(PYTEST_WORKERS) --timeout 1800 --durations 20 $(PYTEST_ARGS)

# The long lane, not in CI: learning runs that prove a published figure (the quickstart's variants,
# the rehearsals, distillation, the reward model's accuracy), the packed update for every preset, and
# the 32B eight-bit decode compiled for TPU. About 25 minutes on 2 cores.
test-long: setup-test setup-tpu-compile
	$(OPTIMISED_CPU_CODE) $(PY) -m pytest -m "long and not tpu and not gpu" -n $(PYTEST_WORKERS) --timeout 3600 --durations 20 $(PYTEST_ARGS)
	$(TPU_VENV)/bin/python -m pytest -m "tpu and long" tests/compile --timeout 1800 -p no:cacheprovider $(PYTEST_ARGS)

# The repository alone (tracked and new files, no ../shared beside it) copied to a temporary folder:
# its default test lane and the quickstart there. The copy's venv comes from uv's cache.
test-alone:
	bash scripts/test_alone.sh

test-all: test test-slow test-long test-tpu-compile test-gpu-compile

# The TPU compiler's environment: the worker image's packages (requirements/lock-tpu.txt, libtpu
# included) as docker/Dockerfile installs them, this package without its dependencies, and pytest.
# uv's cache makes a rebuild take about a minute; CI may keep the folder between runs.
TPU_VENV := .venv-tpu
$(TPU_VENV)/.installed: setup.py requirements/lock-tpu.txt $(VENV)/.installed
	test -x $(TPU_VENV)/bin/python || $(PYTHON) -m venv $(TPU_VENV)
	$(UV) pip install --quiet --compile-bytecode -p $(TPU_VENV)/bin/python -r requirements/lock-tpu.txt
	$(UV) pip install --quiet -p $(TPU_VENV)/bin/python --no-deps -e .
	$(UV) pip install --quiet -p $(TPU_VENV)/bin/python -c requirements/lock.txt pytest pytest-timeout
	touch $@

setup-tpu-compile: $(TPU_VENV)/.installed

# The TPU lane without a TPU: libtpu compiles a small recipe's programs for v5e and v5p slices here.
test-tpu-compile: setup-tpu-compile
	$(TPU_VENV)/bin/python -m pytest -m "tpu and not long" tests/compile --timeout 900 -p no:cacheprovider $(PYTEST_ARGS)

# The GPU compiler's environment: the worker image's packages (requirements/lock-gpu.txt, jax's CUDA 12
# plugin) without the CUDA runtime wheels a compile never loads. Compiling for a GPU on this host needs
# ptxas (nvidia-cuda-nvcc: PTX to SASS for XLA's and Triton's kernels) and cuDNN (jax reads its version
# before it emits a fused-attention call); cuBLAS, cuFFT, cuSOLVER, cuSPARSE, NCCL and NVSHMEM run only
# on a device (measured: the lane's programs compile with exactly these two; docs/compile.md).
GPU_VENV := .venv-gpu
GPU_RUNTIME_ONLY := nvidia-(cublas|cuda-cccl|cuda-cupti|cuda-nvrtc|cuda-runtime|cufft|cusolver|cusparse|nccl|nvjitlink|nvshmem)-cu12
$(GPU_VENV)/.installed: setup.py requirements/lock-gpu.txt $(VENV)/.installed
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	grep -v -E '^$(GPU_RUNTIME_ONLY)==' requirements/lock-gpu.txt > $(GPU_VENV)/compile-lock.txt
	$(UV) pip install --quiet --compile-bytecode --no-deps -p $(GPU_VENV)/bin/python -r $(GPU_VENV)/compile-lock.txt
	$(UV) pip install --quiet -p $(GPU_VENV)/bin/python --no-deps -e .
	$(UV) pip install --quiet -p $(GPU_VENV)/bin/python -c requirements/lock.txt pytest pytest-timeout
	touch $@

setup-gpu-compile: $(GPU_VENV)/.installed

# The GPU lane without a GPU: XLA compiles a small recipe's programs for 1 and 8 H100s, and both GPU
# recipes' roles for their GPUs (L4 workers, an 8 x A100 trainer), from XLA's GPU target descriptions.
test-gpu-compile: setup-gpu-compile
	$(GPU_VENV)/bin/python -m pytest -m gpu tests/compile --timeout 1800 -p no:cacheprovider $(PYTEST_ARGS)

# Side-by-side benchmarks against torch/transformers/TRL (installed only here).
bench: setup
	$(UV) pip install --quiet --compile-bytecode -p $(PY) -c requirements/lock.txt -e '.[bench]'
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Re-resolve the lock file after changing setup.py's dependencies.
lock:
	$(UV) pip compile setup.py --extra test --extra wandb --python-version 3.11 -o requirements/lock.txt

# The accelerator extras, pinned for the worker image (same versions as lock.txt where they meet).
lock-accelerators:
	for a in tpu gpu; do $(UV) pip compile setup.py --extra $$a --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_31 -c requirements/lock.txt -o requirements/lock-$$a.txt || exit 1; done

# The Dataflow worker container (docker/Dockerfile): ACCELERATOR=tpu, gpu or cpu (curation's CPU workers);
# WORKER_IMAGE names it. Dataflow's VMs are x86-64, whatever machine builds the image.
ACCELERATOR ?= tpu
WORKER_IMAGE ?= rlax-worker-$(ACCELERATOR):latest
worker-image:
	@docker info >/dev/null 2>&1 || { echo "make worker-image: no Docker here (no docker command, or no daemon" \
	  "answering); build the image where Docker runs, or with Cloud Build (docs/dataflow.md)" >&2; exit 2; }
	@test "$(ACCELERATOR)" = tpu -o "$(ACCELERATOR)" = gpu -o "$(ACCELERATOR)" = cpu || { echo "make worker-image:" \
	  "ACCELERATOR is tpu, gpu or cpu, not '$(ACCELERATOR)'" >&2; exit 2; }
	docker build --platform linux/amd64 -f docker/Dockerfile --build-arg ACCELERATOR=$(ACCELERATOR) \
	  -t $(WORKER_IMAGE) .

sdist: $(VENV)/.installed
	$(PY) -m build --sdist --outdir dist . 2>/dev/null || $(PY) setup.py -q sdist -d dist

# A wheel built from the sdist, as pip builds one: every module, recipe (pipelines/configs) and asset.
wheel: sdist
	$(UV) build --wheel --offline --out-dir dist dist/rlax_beam-*.tar.gz

clean:
	rm -rf $(VENV) $(TPU_VENV) $(GPU_VENV) dist build *.egg-info
