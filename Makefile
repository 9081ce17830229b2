# Two commands do all set-up on a fresh machine:  `make book`  and  `make test`.
# Each creates .venv (Python >= 3.11) and installs the pinned environment the first time.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PYTHONUNBUFFERED := 1

.PHONY: help venv book test lab bench check ptx doctor lock clean exercises

help:
	@echo "make book    build the course site into _build/html (executes every chapter)"
	@echo "make test    run the whole test suite (builds the book first; the browser test needs it)"
	@echo "make lab     open the chapters and exercises in JupyterLab"
	@echo "make bench   benchmark every op on this machine's CPU (and GPU, if there is one)"
	@echo "make check   parity of every registered kernel against its float64 reference"
	@echo "make exercises  regenerate exercises/ and the autograder (_build/autograder) from solutions/"

$(STAMP): pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (set PYTHON=...)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[all]'
	touch $@

venv: $(STAMP)

# The execution cache (_build/.jupyter_cache) re-executes a page only when its code cells change. It
# cannot see changes to the library or to the benchmark data the pages read, so those clear it. Sphinx
# does not recopy static files (CSS, vendored JS) when no page changed, so those make it re-read the pages.
BOOK_EXEC_DEPS = $(sort $(shell find kernels_src book/data -type f \( -name '*.py' -o -name '*.json' \) 2>/dev/null))
BOOK_SITE_DEPS = $(sort $(shell find book/_static book/_vendor book/_ext -type f ! -name '*.pyc' 2>/dev/null))

book: $(STAMP)
	@mkdir -p _build; \
	exec_key=$$(cat $(BOOK_EXEC_DEPS) /dev/null | sha256sum | cut -c1-16); \
	site_key=$$(cat $(BOOK_SITE_DEPS) /dev/null | sha256sum | cut -c1-16); \
	if [ "$$(cat _build/.book_exec_key 2>/dev/null)" != "$$exec_key" ]; then \
	    if [ -d _build/.jupyter_cache ]; then echo "kernels_src/ or book/data/ changed: every page is re-executed"; fi; \
	    rm -rf _build/.jupyter_cache _build/.doctrees; echo "$$exec_key" > _build/.book_exec_key; fi; \
	if [ "$$(cat _build/.book_site_key 2>/dev/null)" != "$$site_key" ]; then \
	    rm -rf _build/.doctrees; echo "$$site_key" > _build/.book_site_key; fi
	@# On failure, forget the parsed pages: Sphinx would otherwise not re-read (and re-report) them.
	JUPYTER_PREFER_ENV_PATH=1 $(BIN)/jupyter-book build . --path-output . -W -n --keep-going \
	    || { rm -rf _build/.doctrees; echo "make book: the build failed (warnings are errors)" >&2; exit 1; }
	@echo
	@echo "The course site is in _build/html. To read it:"
	@echo "    $(BIN)/python -m http.server -d _build/html   # then open http://localhost:8000"

test: book
	$(BIN)/python -m pytest -n auto

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

lock: $(STAMP)
	@# --all: setuptools and wheel too (a 3.11 venv ships them, so plain freeze hides them; from 3.12 on
	@# the venv has none and pip would take the newest).
	$(BIN)/python -m pip freeze --all --exclude-editable | grep -v -e '^kernels' -e '^pip==' > requirements.lock.new
	@echo "wrote requirements.lock.new; review and move it over requirements.lock"

clean:
	rm -rf _build

# Student notebooks (exercises/, committed) and the autograder with hidden tests (_build/autograder/,
# not committed) from the master notebooks in solutions/; see kernels_src/grading/exercises.py.
exercises: $(STAMP)
	$(BIN)/python -m kernels_src.grading.exercises
