"""Roofline simulator of a GPU deployment: executor type ``sim``.

The deployment record, the cost model and the capacity model live in
``orchestrator/common/`` (the simulator's planner and report share them); this package
is only the executor.
"""

from plugins.sim_executor.executor import SimExecutor

__all__ = ["SimExecutor"]
