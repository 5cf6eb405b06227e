"""Simulator: the real scheduler and ``EngineCore`` on a virtual clock, against the
``sim`` executor's cost model of GPUs; ``orchestrator simulate | tune | plan |
calibrate``.

Modules: ``workload`` (arrivals and lengths), ``driver`` (discrete-event loop, replicas),
``router``, ``report`` (metrics from ``orchestrator.common.metrics`` plus occupancy, KV usage,
utilisation), ``runner`` (config to report, rate searches), ``plan`` and ``tune`` (the
searches), ``plots``, ``calibrate`` (fits the cost model to this machine), ``cli`` and
``commands`` (the sub-commands).
"""
