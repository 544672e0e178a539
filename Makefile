# Everything sets itself up: venv, Python deps, Kafka jars (via mvn, cached in ~/.cache/streamsched).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv jars lint test test-unit test-kafka demo bench broker-start broker-stop clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

jars: venv
	$(BIN)/python -c "from streamsched.ops.broker import ensure_jars; print('kafka jars:', ensure_jars())"

lint: venv
	$(BIN)/ruff check streamsched tests consumers bench scripts
	$(BIN)/mypy

test: venv jars lint
	$(BIN)/python -m pytest -q -ra

test-unit: venv
	$(BIN)/python -m pytest -q -m "not kafka"

demo: venv jars
	$(BIN)/python scripts/demo.py

bench: venv jars
	$(BIN)/python bench/turns.py
	$(BIN)/python bench/schedules.py

broker-start: venv jars
	$(BIN)/streamsched broker start

broker-stop: venv
	$(BIN)/streamsched broker stop

clean:
	-$(BIN)/streamsched broker stop
	rm -rf .streamsched .pytest_cache .mypy_cache .ruff_cache
