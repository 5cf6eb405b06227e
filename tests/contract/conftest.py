"""The executors the contract suite runs against; another executor is one more entry in
``CASES``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from orchestrator.core.executor import Executor
from tests.fakes import FakeExecutor


@dataclass(frozen=True)
class ExecutorCase:
    """How to build a fresh executor of one kind, and what the suite needs to know of it:
    its block size (tokens), the exclusive upper bound of its token ids, whether it
    implements logprobs (an executor may return none), whether those include the top
    alternatives, and whether a seeded request's random sequence survives preemption
    (an executor that seeds a request once, when it is enqueued, cannot resume one).
    ``decode`` turns token ids into text, for an executor that enforces constraints
    (the suite checks its constrained tokens); ``None`` elsewhere."""

    build: Callable[[], Executor]
    block_size: int
    vocab_size: int
    returns_logprobs: bool = True
    top_logprobs: bool = True
    seeded_survives_preemption: bool = True
    decode: Callable[[list[int]], str] | None = None


def fake_case(tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    return ExecutorCase(lambda: FakeExecutor(num_blocks=64, block_size=16), 16, 1000, False)


def torch_tiny_case(tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    import torch

    from plugins.torch_executor import TorchExecutor
    from plugins.torch_executor.weights import load_folder
    from tests.e2e.models import TINY_CONFIG, write_tiny_llama

    weights = load_folder(write_tiny_llama(tmp_path_factory.mktemp("tiny")), torch.float32)
    return ExecutorCase(
        lambda: TorchExecutor(weights, block_size=4, num_blocks=96, seed=0),
        4,
        TINY_CONFIG["vocab_size"],
    )


def torch_smollm2_case(tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    import torch

    from plugins.torch_executor import TorchExecutor
    from tests.e2e.constrained import grammar_backend
    from tests.e2e.models import session_cache_dir, smollm_weights

    # float32: batched and single-row matmuls then differ by ~1e-6, far below the gap
    # between the candidates a greedy or seeded choice picks from.
    cache_dir = session_cache_dir(tmp_path_factory)
    weights = smollm_weights(cache_dir, torch.float32)
    grammar = grammar_backend(weights, cache_dir)  # constraints on, as from_config builds it
    return ExecutorCase(
        lambda: TorchExecutor(weights, block_size=16, num_blocks=64, seed=0, grammar=grammar),
        16,
        weights.args.vocab_size,
        decode=grammar.tokenizer.decode_str,
    )


def sim_case(tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    from orchestrator.common.specs import load_model_spec
    from orchestrator.core.config import EngineConfig
    from plugins.sim_executor import SimExecutor

    engine = EngineConfig.model_validate(
        {
            "model": {"max_model_len": 2048},
            "executor": {"type": "sim", "model": "smollm2-135m", "hardware": "l40s"},
        }
    )
    return ExecutorCase(
        lambda: SimExecutor.from_config(engine.executor.options, engine),
        engine.cache.block_size,
        load_model_spec("smollm2-135m").vocab_size,
        returns_logprobs=False,
    )


def trtllm_fake_case(tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    from tests.trtllm.contract_case import trtllm_fake_case as build_case

    return build_case(tmp_path_factory)


def trtllm_llmapi_fake_case(tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    from tests.trtllm.contract_case import trtllm_llmapi_fake_case as build_case

    return build_case(tmp_path_factory)


# Adding an executor to the suite: one more entry here.
CASES = [
    pytest.param(fake_case, id="fake"),
    pytest.param(torch_tiny_case, id="torch-tiny"),
    pytest.param(torch_smollm2_case, id="torch-smollm2", marks=pytest.mark.slow),
    pytest.param(sim_case, id="sim"),
    pytest.param(trtllm_fake_case, id="trtllm-fake"),
    pytest.param(trtllm_llmapi_fake_case, id="trtllm-llmapi-fake"),
]


@pytest.fixture(scope="session", params=CASES)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    factory: Callable[[pytest.TempPathFactory], ExecutorCase] = request.param
    return factory(tmp_path_factory)


@pytest.fixture
def executor(case: ExecutorCase) -> Executor:
    return case.build()


@pytest.fixture(scope="package", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread for this package (see tests/e2e/conftest.py for why);
    restored afterwards."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
