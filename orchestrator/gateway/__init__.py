"""OpenAI-compatible HTTP gateway (FastAPI): the only package that imports FastAPI."""
