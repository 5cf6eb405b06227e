"""Tenant fair share in the simulator: does a light tenant keep its SLO next to a heavy one?

Llama-3-70B FP8 on two H100s (configs/sim/llama3-70b-fp8-h100-tp2.yaml), one SLO class
(TTFT 500 ms, TPOT 80 ms). Two tenants send Poisson traffic, ``heavy`` at ten times
``light``'s rate; together they offer ``--load`` x the saturation rate measured in this
run (the highest rate at which fcfs keeps 90% of requests within the SLO). Three runs of
the same requests:

- light alone (heavy's requests removed): the light tenant's attainment with the machine
  to itself, the reference;
- both tenants, ``fcfs`` (arrival order);
- both tenants, ``fcfs`` with ``fair_share`` (VTC counters: the least-served tenant's
  request is admitted first).

Run: .venv/bin/python benchmarks/fair_share.py [--requests 2000] [--load 1.3]
Last line: ``fair share: light tenant attainment <P>% alone, <Q>% with heavy tenant
(fcfs: <R>%)``; the target is Q within 10 points of P.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.common.metrics import SLO, RequestRecord
from orchestrator.common.workloads import Workload, build_workload
from orchestrator.core import EngineConfig, SchedulerConfig
from orchestrator.sim.config import SimConfig, load_sim_config
from orchestrator.sim.driver import simulate
from orchestrator.sim.router import make_router
from orchestrator.sim.runner import max_sustainable_rate

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs/sim/llama3-70b-fp8-h100-tp2.yaml"


def engine_with(config: SimConfig, **scheduler: object) -> EngineConfig:
    data = config.engine.scheduler.model_dump()
    data.update(scheduler)
    return config.engine.model_copy(update={"scheduler": SchedulerConfig.model_validate(data)})


def attainment(records: list[RequestRecord], tenant: str, slo: SLO) -> float:
    mine = [r for r in records if r.tenant == tenant]
    return sum(1 for r in mine if slo.met_by(r)) / len(mine)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--load", type=float, default=1.3, help="x the saturation rate")
    args = parser.parse_args(argv)

    config = load_sim_config(CONFIG)
    slo = config.slo.to_slo()
    probe = config.model_copy(
        update={"workload": config.workload.model_copy(update={"num_requests": 600})}
    )
    saturation = max_sustainable_rate(probe, 0.9, iterations=6).rate
    if saturation is None:
        print("fcfs met the SLO at no rate tried", file=sys.stderr)
        return 1
    rate = saturation * args.load
    workload_config = config.workload.with_rate(rate).model_copy(
        update={"num_requests": args.requests, "tenants": {"heavy": 10.0, "light": 1.0}}
    )
    both = build_workload(workload_config)
    alone = Workload([r for r in both.requests if r.tenant == "light"])
    router = make_router(config.cluster.router)
    print(f"saturation {saturation:.2f} req/s; offering {rate:.2f} req/s (heavy:light = 10:1)")

    fcfs = engine_with(config, policy="fcfs")
    fair = engine_with(config, policy="fcfs", fair_share={"enabled": True})
    p = attainment(simulate(fcfs, alone, router).records, "light", slo)
    r_run = simulate(fcfs, both, router).records
    q_run = simulate(fair, both, router).records
    r, q = attainment(r_run, "light", slo), attainment(q_run, "light", slo)
    for name, records in (("fcfs", r_run), ("fair share", q_run)):
        print(
            f"{name:>10}: light {attainment(records, 'light', slo):.1%}, "
            f"heavy {attainment(records, 'heavy', slo):.1%} within SLO"
        )
    print(
        f"fair share: light tenant attainment {p:.0%} alone, {q:.0%} with heavy tenant "
        f"(fcfs: {r:.0%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
