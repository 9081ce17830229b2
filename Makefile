# Two commands do all set-up on a fresh machine:  `make book`  and  `make test`.
# Each creates .venv (Python >= 3.11) and installs the pinned environment the first time.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PYTHONUNBUFFERED := 1

.PHONY: help venv book test lab bench check ptx doctor lock clean exercises platforms

help:
	@echo "make book    build the course site into _build/html (executes every chapter)"
	@echo "make test    run the whole test suite (builds the book first; the browser test needs it)"
	@echo "make lab     open the chapters and exercises in JupyterLab"
	@echo "make bench   benchmark every op on this machine's CPU (and GPU, if there is one)"
	@echo "make check   parity of every registered kernel against its float64 reference"
	@echo "make exercises  regenerate exercises/ and the autograder (_build/autograder) from solutions/"
	@echo "make platforms  check that PyPI has a wheel of every pin for macOS (python make.py platforms --help)"
	@echo "No make? python make.py book | test | lab does the same. Windows: use WSL2 (README, Windows: WSL2)."

# make.py does the set-up, the book and the tests (the same commands without make: `python make.py book`);
# these targets call it, so the two spellings cannot drift apart. It installs the `all` extra with
# `pip install -c requirements.lock`, whose markers give each platform its set (macOS: no numba-cuda).
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) make.py venv

venv: $(STAMP)

# The book: make.py clears the execution cache when kernels_src/ or book/data/ changed (the cache sees only
# the pages' code cells), then builds with warnings as errors.
book:
	$(PYTHON) make.py book

test:
	$(PYTHON) make.py test

# .jupyter/labconfig makes JupyterLab open the jupytext .md notebooks as notebooks on a double click.
lab: $(STAMP)
	JUPYTER_CONFIG_PATH=$(CURDIR)/.jupyter JUPYTER_PREFER_ENV_PATH=1 $(BIN)/jupyter lab --notebook-dir=. \
	    $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

check: $(STAMP)
	$(BIN)/python -m kernels_src check

ptx: $(STAMP)
	$(BIN)/python -m kernels_src ptx

doctor: $(STAMP)
	$(BIN)/python -m kernels_src doctor

bench: $(STAMP)
	$(BIN)/python -m kernels_src.benchall --out _build/bench

# requirements.lock.new from .venv (pip freeze --all, so setuptools and wheel too), keeping the old lock's
# platform markers and its macOS/Windows-only pins; then `python make.py platforms --download` checks PyPI.
lock: $(STAMP)
	$(PYTHON) make.py lock

clean:
	rm -rf _build

platforms:
	$(PYTHON) make.py platforms --download

# Student notebooks (exercises/, committed) and the autograder with hidden tests (_build/autograder/,
# not committed) from the master notebooks in solutions/; see kernels_src/grading/exercises.py.
exercises: $(STAMP)
	$(BIN)/python -m kernels_src.grading.exercises
