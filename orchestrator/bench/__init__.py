"""Benchmark client for any OpenAI-compatible server: ``orchestrator bench``.

It measures, from the client side, the metrics defined once in ``orchestrator.common.metrics``
(TTFT, TPOT, ITL, end-to-end latency, output throughput, goodput under an SLO) for a
workload written to a file so that another server can replay exactly the same requests.
"""
