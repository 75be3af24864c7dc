# The two commands of the README: `make demo` and `make test`.
# Each creates .venv with a Python 3.12+ on first use and installs the project into it.

VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test serve lint typecheck ci clean

$(STAMP): pyproject.toml
	@test -x $(PY) || "$$(scripts/find-python)" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/loopwright demo --yes $(ARGS)

# Two test processes: most tests wait on processes, HTTP and databases, not on a core.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) $(ARGS)

# The LangGraph server on Postgres (DATABASE_URL), offline, with the approval inbox; see README.
serve: $(STAMP)
	$(VENV)/bin/loopwright serve $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

ci: test lint typecheck

clean:
	rm -rf $(VENV) .loopwright .pytest_cache .mypy_cache .ruff_cache
