# tokenflow — every target sets up .venv itself, so a fresh clone needs only `make demo` / `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: demo test bench evaluation lint venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tokenflow demo --workers 2 --events 1000000 --output out/demo

# Test files run on TEST_WORKERS pytest-xdist processes: most tests wait on sockets, worker
# start-up or Spark far more than they compute (the suite took 20 min on one process, 12 on two).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) tests

bench: $(STAMP)
	$(BIN)/pip install -q -e ".[dev,bench]"
	for script in benchmarks/*.py; do $(BIN)/python $$script || exit 1; done

evaluation: $(STAMP)
	$(BIN)/pip install -q -e ".[dev,bench]"
	for s in granularity overhead scaling chains tracker nexmark; do $(BIN)/python -m benchmarks.evaluation.$$s || exit 1; done
	$(BIN)/python benchmarks/peers.py

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
