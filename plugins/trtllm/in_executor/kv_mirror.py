"""The core's KV manager held to TensorRT-LLM's allocation rule, so the core never
plans what TensorRT-LLM's KV manager cannot allocate.

TensorRT-LLM's PyTorch ``KVCacheManager.prepare_resources``
(``tensorrt_llm/_torch/pyexecutor/resource_manager.py``, stored copies read; the index
exposes no commit id) allocates, for a context request on its first chunk,
``add_sequence(py_request_id, prompt_len, ...)``: blocks for the whole prompt at once,
however small the chunk; then one ``add_token`` per generation step, which takes a new
block when the last one is full. A paused request frees everything
(``PyExecutor._pause_requests``: ``req.pause(max_input_len)``, then
``_terminate_request``) and comes back as a context request whose prompt holds its
generated tokens, so its first chunk again allocates the whole.

``KvMirror`` is our ``KVCacheManager`` with that first-chunk rule: a request that holds
no blocks gets blocks for all its known tokens. Decode steps already match (ceil of
computed plus one over the block size). Prefix caching is off in the mirror: in this mode
TensorRT-LLM's block reuse is off too (``llm_api.settings``), because reuse moves
TensorRT-LLM's context position after our plan is made. The pool's size is
TensorRT-LLM's ``max_num_blocks``; each iteration the adapter also hands the core
TensorRT-LLM's own free count (``observe_executor_free``), and both admission and every
allocation use the tighter picture.
"""

from __future__ import annotations

from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.request import Request


class KvMirror(KVCacheManager):
    """A ``KVCacheManager`` that allocates a request's whole known tokens on its first
    chunk, as TensorRT-LLM's ``add_sequence`` does; ``headroom_blocks`` as the core's."""

    def __init__(self, num_blocks: int, block_size: int, *, headroom_blocks: int = 1) -> None:
        super().__init__(num_blocks, block_size, False, headroom_blocks=headroom_blocks)
        self._shortfall = 0  # blocks TensorRT-LLM had fewer free than the pool, last read

    def observe_executor_free(self, free_blocks: int) -> None:
        super().observe_executor_free(free_blocks)
        self._shortfall = max(0, self.num_free_blocks - free_blocks)

    def allocate(
        self, request: Request, num_new_tokens: int, cached_prefix: list[int] | None = None
    ) -> list[int] | None:
        """As ``KVCacheManager.allocate``, with the whole known tokens on a request's
        first chunk, and ``None`` also when TensorRT-LLM's last free count cannot hold
        the new blocks (it frees an ended request's blocks when it processes the
        request's last step, an iteration late under the overlap scheduler)."""
        held = len(self.block_table(request.request_id))
        if not held and num_new_tokens > 0:
            # First chunk: TensorRT-LLM's add_sequence takes blocks for the whole prompt.
            whole = request.num_tokens - request.num_computed_tokens
            num_new_tokens = max(num_new_tokens, whole)
        need = self.blocks_for(request.num_computed_tokens + num_new_tokens) - held
        if need > 0 and need > self.num_free_blocks - self._shortfall:
            return None
        return super().allocate(request, num_new_tokens, cached_prefix)
