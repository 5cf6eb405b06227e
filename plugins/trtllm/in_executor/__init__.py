"""In-executor scheduling: our core's ``Scheduler`` as TensorRT-LLM's ``RequestScheduler``
inside the PyTorch backend's executor loop (LLM-API mode, checked releases only).

``adapter`` presents the executor's ``LlmRequest``s to the core (an ``EngineCore`` whose
KV manager mirrors TensorRT-LLM's) and maps its plan back; ``factory`` builds it for each
executor TensorRT-LLM builds; ``facts`` carries per-request facts (priority, SLO class,
tenant) to the scheduler and ``refusals`` its refusals back; ``ranks`` makes every
tensor-parallel rank follow rank 0's decision; ``install`` puts the factory where
TensorRT-LLM builds its scheduler, behind the version gate; ``workers`` does so in each
MPI worker process when there is more than one rank, and ``channel`` then carries facts
and refusals between the serving process and rank 0; ``start`` sets it all up in the
serving process; ``settings`` is what the scheduler is built from. Nothing here imports
TensorRT-LLM at module level.

Imports go one way: ``llm_api`` (the executor that runs this mode) imports this package,
and nothing here imports ``llm_api``.
"""
