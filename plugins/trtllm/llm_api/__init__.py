"""TensorRT-LLM LLM-API mode (PyTorch backend): executor type ``trtllm-llmapi``.

Importing this package does not import TensorRT-LLM; starting an executor does.

Imports go one way: this package imports ``in_executor`` (the scheduler it installs
inside TensorRT-LLM's loop with ``scheduling: in_executor``, built from
``in_executor.settings.InExecutorCore``), never the other way.
"""
