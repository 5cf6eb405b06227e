"""Our engine as an NVIDIA Dynamo backend worker (``orchestrator dynamo-worker``).

``protocol`` maps Dynamo's request and response dicts and our errors, ``model_folder``
writes the Hugging Face folder Dynamo's frontend loads, ``kv_events`` forwards the
core's KV events to Dynamo's publisher; none of them imports Dynamo. ``engine`` is the
``LLMEngine`` itself and imports Dynamo (the ``fleet`` extra), so only the command's
``run`` imports it.
"""
