"""Iteration-level scheduler: plain Python, no torch, FastAPI or TensorRT-LLM."""
