"""The OpenAI API as JSON, one module per endpoint as vLLM splits its protocol:
``completions.py`` (``/v1/completions``), ``chat.py`` (``/v1/chat/completions``) and
``shared.py`` (the bounds, the strict request base, the fields both generation
endpoints take, usage, the models list and the error body). Nothing outside
``orchestrator.gateway`` imports them: the serving layer turns these into engine
``Submission``s."""
