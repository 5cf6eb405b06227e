"""In-executor scheduling: our core's ``Scheduler`` as TensorRT-LLM's ``RequestScheduler``
inside the PyTorch backend's executor loop (LLM-API mode, checked releases only).

``adapter`` presents the executor's ``LlmRequest``s to the core (an ``EngineCore`` whose
KV manager mirrors TensorRT-LLM's) and maps its plan back; ``start`` builds it in the
worker; ``facts`` carries per-request facts (priority, SLO class, tenant) to the worker;
``ranks`` makes every tensor-parallel rank follow rank 0's decision; ``install`` puts
the adapter where TensorRT-LLM builds its scheduler, behind the version gate. Nothing
here imports TensorRT-LLM at module level.
"""
