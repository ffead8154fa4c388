# Every target sets itself up on a fresh machine: uv is installed with pip if missing, then
# `uv sync --locked` builds .venv from uv.lock (torch and torchvision from PyPI).
UV := $(shell command -v uv 2>/dev/null || echo python3 -m uv)
RUN := $(UV) run --locked --extra dev --extra launchers --extra trackers --extra export --extra s3
ARGS ?=

.PHONY: help setup train test test-all verify-previous mutants mutants-known lint format sweep train-ddp bench clean

help:
	@echo "make train   - train the default model on the built-in synthetic data (ARGS='key=value ...')"
	@echo "make test    - the test suite (fast; 'make test-all' adds slow tests)"
	@echo "make sweep   - 5 seeds of the default config in parallel, then their statistics"
	@echo "make train-ddp - the default run as 2 DistributedDataParallel processes (torchrun)"
	@echo "make bench   - speed or exactness on this machine: ARGS='suite=knobs|overhead|startup|exactness [overrides]'"
	@echo "make verify-previous - train a short config here and at the previous commit: identical?"
	@echo "make lint    - ruff lint and format check, and the layers of src/repro (import-linter)"
	@echo "make mutants - mutmut over every module of src/ and its fast tests, against the recorded scores (ARGS='runs/integrity.py --record')"
	@echo "make mutants-known - apply one known bug at a time and check that the slow tests catch each"

setup: .venv/.synced

# The start-up hook (src/repro_safe_path.pth) is copied into the environment, not linked:
# a change to it reinstalls the package.
.venv/.synced: pyproject.toml uv.lock Makefile src/repro_safe_path.pth
	@command -v uv >/dev/null 2>&1 || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
	$(UV) sync --locked --compile-bytecode --reinstall-package repro --extra dev --extra launchers --extra trackers --extra export --extra s3
	@touch $@

train: setup
	$(RUN) python -m repro.train $(ARGS)

bench: setup
	$(RUN) python -m benchmarks $(ARGS)

# Two pytest workers, one test file each at a time (a file's fixtures are shared by its tests).
PYTEST := pytest -n 2 --dist loadfile

test: setup
	$(RUN) $(PYTEST) -m "not slow" $(ARGS)

test-all: setup
	$(RUN) $(PYTEST) $(ARGS)

# CI's check that a commit changed no result (docs/reproducibility.md): a short run here and at
# HEAD~1, compared step by step. A commit meant to change results says [changes results] in its
# message (or, for a merge, one of the merged commits does): the difference is then printed and
# the target passes. Nothing to compare on a first commit.
verify-previous: setup
	@if ! git rev-parse --quiet --verify HEAD~1 >/dev/null; then \
		echo "verify-previous: no previous commit to compare with"; exit 0; fi; \
	$(RUN) python -m repro.verify --against HEAD~1 $(ARGS); status=$$?; \
	if [ $$status = 1 ] && git log --format=%B HEAD~1..HEAD | grep -qF "[changes results]"; then \
		echo "verify-previous: results changed, as the commit message says"; status=0; fi; \
	exit $$status

# Neither is part of `make test`: minutes, for whoever changes a module, a promise or the
# tests that guard them (README, Development). `mutants`: mutmut over the modules of
# scripts/mutation.toml, each against its fast tests; ARGS names some (ARGS="runs/integrity.py
# sweeps/"). `mutants-known`: the hand-written bugs of scripts/mutants.py against end-to-end
# tests (ARGS="--list").
mutants: setup
	$(RUN) python scripts/mutation.py $(ARGS)

mutants-known: setup
	$(RUN) python scripts/mutants.py $(ARGS)

lint: setup
	$(RUN) ruff check src tests scripts benchmarks
	$(RUN) ruff format --check src tests scripts benchmarks
	$(RUN) lint-imports --no-logo

format: setup
	$(RUN) ruff format src tests scripts benchmarks
	$(RUN) ruff check --fix src tests scripts benchmarks

sweep: setup
	$(RUN) python -m repro.train -m seed=0,1,2,3,4 hydra/launcher=joblib hydra.launcher.n_jobs=2 $(ARGS)

train-ddp: setup
	$(RUN) torchrun --nproc_per_node=2 -m repro.train $(ARGS)

clean:
	rm -rf outputs/runs outputs/sweeps .pytest_cache .ruff_cache mutants
