# The commands of the README: `make demo`, `make test` and `make test-quick`.
# Each creates .venv with a Python 3.12+ on first use and installs the project into it.

VENV := .venv
PY := $(VENV)/bin/python
# The demo needs the runtime and the reference agent, two distributions of this repository
# (pyproject.toml, refunds/pyproject.toml), installed editable; tests, linters and the type
# checker add the dev extras. Each stamp is remade when either pyproject.toml changes.
DEMO := $(VENV)/.installed-demo
DEV := $(VENV)/.installed-dev
PIP := PYTHONWARNINGS=ignore $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: demo test test-quick serve lint typecheck ci clean

$(PY):
	@echo "make: creating $(VENV) with $$(scripts/find-python)"
	@"$$(scripts/find-python)" -m venv $(VENV)

$(DEMO): pyproject.toml refunds/pyproject.toml | $(PY)
	@echo "make: installing loopwright and its reference agent into $(VENV) (the first time: a minute or two)"
	@$(PIP) -e . -e ./refunds
	@touch $@
	@echo "make: installed"

$(DEV): $(DEMO)
	@echo "make: installing the test, lint and type-check tools into $(VENV)"
	@$(PIP) -e '.[dev]'
	@touch $@

demo: $(DEMO)
	$(VENV)/bin/loopwright demo --yes $(ARGS)

# Four test processes on CI's two cores: many tests wait on processes, HTTP and databases, not
# on a core. Quiet, the same code: 8:48 with three (the cores 73% busy), 7:35-7:45 with four
# (89%, the four busy to within 5 s of the end), 8:10 with five; earlier, 14:49 with two.
# With the tests' own CPU a fifth lower, on a slower machine: 9:54 with four, 9:42 with five.
TEST_WORKERS ?= 4
# Tests in collection order (the longest first), each module's tests that share a server of the
# module on one worker, so it starts once (tests/conftest.py: LONGEST_FIRST, `_shared_group`).
XDIST := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test: $(DEV)
	$(PY) -m pytest $(XDIST) $(ARGS)

# Every module's core behaviour in a minute or so (the `quick` mark, tests/conftest.py).
test-quick: $(DEV)
	$(PY) -m pytest $(XDIST) -m quick $(ARGS)

# The LangGraph server on Postgres (DATABASE_URL), offline, with the approval inbox (docs/serving.md).
serve: $(DEMO)
	$(VENV)/bin/loopwright serve $(ARGS)

lint: $(DEV)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(DEV)
	$(VENV)/bin/mypy

ci: test lint typecheck

clean:
	rm -rf $(VENV) .loopwright .pytest_cache .mypy_cache .ruff_cache
