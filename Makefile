# kvscope: two commands do all set-up on a fresh machine.
#   make demo   creates .venv, installs kvscope, runs the main job on the built-in engine model
#   make test   creates .venv, installs the test extras, runs tests/setup.d/* (Debian packages and
#               services the tests need), lints (ruff, import-linter, mypy --strict on the seams,
#               notebooks stored without outputs), runs the whole pytest suite; this is CI (.ci/run)
# The inner loop, once .venv exists (it is created if not; no setup.d):
#   make check  ruff, import-linter, mypy, then the unit and contract tests and tests/test_*.py except
#               those marked slow (under 3 minutes on two cores); `make test` runs those too
# Each check runs once per target: import-linter and mypy run in `make lint`, not again as tests.
# Long runs stay out of `make test`: `make bench`, `make soak`.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export KVSCOPE_VENV := $(abspath $(VENV))
export KVSCOPE_ROOT := $(abspath .)

.PHONY: demo test check lint setup-test bench soak clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip

$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[otel,ui,live,notebook]'
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.demo-installed
	$(BIN)/kvscope demo
	@echo "live dashboard (remediation switch, scenario picker): $(BIN)/voila --MappingKernelManager.cull_interval=60 --MappingKernelManager.cull_idle_timeout=300 notebooks/02_live_dashboard.ipynb"
	@echo "  then open the printed http://localhost:8866/ address; all notebooks: $(BIN)/jupyter lab notebooks/"

setup-test: $(VENV)/.test-installed
	@for s in tests/setup.d/*.sh; do \
	  [ -x "$$s" ] || continue; echo "== $$s"; "$$s" || exit 1; done

lint: $(VENV)/.test-installed
	$(BIN)/ruff check kvscope remediation tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python notebooks/strip_outputs.py --check
	@# Python 3.10 compatibility: ruff's py310 target here, and tests/test_architecture.py
	@# (post-3.10 stdlib names, compile under a real 3.10 interpreter).

test: setup-test lint
	$(BIN)/pytest -q -p no:cacheprovider --durations=25

# What `make check` leaves out: the integration, e2e, notebook and reliability folders (real
# collectors, browsers, Jupyter, fault injection) and the tests marked slow (seconds each: full
# replays, demo runs, engine subprocesses).
CHECK_TESTS := tests/unit tests/contract tests/test_architecture.py tests/test_checkout_state.py

check: $(VENV)/.test-installed
	$(BIN)/ruff check kvscope remediation tests bench
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider -m "not slow" --durations=10 $(CHECK_TESTS)

# Every benchmark runs; one that misses a target is named at the end and fails the target.
bench: $(VENV)/.test-installed
	@missed=""; for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python "$$b" || missed="$$missed $$b"; done; \
	if [ -n "$$missed" ]; then echo "targets missed in:$$missed"; exit 1; fi

# soak: the property/fuzz/fault suites with the long hypothesis profile, then every soak-marked test.
soak: $(VENV)/.test-installed
	KVSCOPE_SOAK=1 KVSCOPE_HYPOTHESIS_PROFILE=soak $(BIN)/pytest -q -p no:cacheprovider tests/reliability
	KVSCOPE_SOAK=1 $(BIN)/pytest -q -p no:cacheprovider -m soak tests --ignore=tests/reliability || [ $$? -eq 5 ]

clean:
	rm -rf $(VENV) .cache build *.egg-info
