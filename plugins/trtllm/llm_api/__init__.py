"""TensorRT-LLM LLM-API mode (PyTorch backend): executor type ``trtllm-llmapi``.

Importing this package does not import TensorRT-LLM; starting an executor does.
"""
