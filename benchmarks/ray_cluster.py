"""A burst on a Ray cluster against the same burst on this machine: how long each takes to start, and what a cluster
burst costs besides its steps.

A two-node cluster of one CPU each on loopback (``ray.cluster_utils.Cluster``, as tests/engine/test_ray.py starts it),
a DDP x 2 burst of the MLP demo with one rank per node, against the same burst as two local ranks (forked from the
warm forkserver). Interleaved, ``--repeats`` times each, after one unmeasured burst of each (a warm session):

- start-up: from calling ``run_burst`` to the first step event of every rank;
- per-burst overhead: the call's wall time minus its ranks' measured window (setup, warm-up and teardown included),
  and the cluster's minus the local one's, burst by burst.

    python benchmarks/ray_cluster.py [--repeats 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from _common import positive_int, spread, table, write_json

LEAN_NODE = {"include_dashboard": False, "include_log_monitor": False}


def timed_burst(workload: Any, config: Any, steps: int, options: Any) -> dict[str, float]:
    """One burst: launch to every rank's first step, the call's wall time, and that less the measured window."""
    import accel_widgets as aw

    started = time.perf_counter()
    first: dict[int, float] = {}

    def on_event(event: object) -> None:
        if isinstance(event, aw.StepRecord) and event.rank not in first:
            first[event.rank] = time.perf_counter()

    result = aw.run_burst(workload, config, steps=steps, on_event=on_event, options=options)
    wall = time.perf_counter() - started
    measured = result.measured_steps()
    window = max(s.t for s in measured) - min(s.t - s.total_s for s in measured)
    return {"first_step_s": max(first.values()) - started, "wall_s": wall, "overhead_s": wall - window}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--steps", type=positive_int, default=20)
    args = parser.parse_args()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported: every address on loopback
    import ray
    from ray.cluster_utils import Cluster

    import accel_widgets as aw

    started = time.perf_counter()
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", **LEAN_NODE, "no_monitor": True})
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", **LEAN_NODE)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster_start_s = time.perf_counter() - started
    try:
        workload, config = aw.demo_workload("mlp"), aw.Config(parallel="ddp", world_size=2)
        device = aw.probe_device()
        local = aw.BurstOptions(device=device)
        remote = aw.BurstOptions(device=device, cluster=aw.RayCluster(address=cluster.address,
                                                                      placement="STRICT_SPREAD"))
        runs: dict[str, list[dict[str, float]]] = {"local": [], "cluster": []}
        for options in (local, remote):  # unmeasured: a working session has its forkserver and Ray workers warm
            timed_burst(workload, config, args.steps, options)
        for _ in range(args.repeats):  # interleaved, so the machine's drift hits both alike
            runs["local"].append(timed_burst(workload, config, args.steps, local))
            runs["cluster"].append(timed_burst(workload, config, args.steps, remote))
    finally:
        ray.shutdown()
        cluster.shutdown()
    stats = {kind: {key: spread([run[key] for run in each]) for key in ("first_step_s", "wall_s", "overhead_s")}
             for kind, each in runs.items()}
    extra = spread([c["wall_s"] - loc["wall_s"] for c, loc in zip(runs["cluster"], runs["local"], strict=True)])
    rows = [[f"{kind}: {key}", *(f"{stats[kind][key][k]:.2f}" for k in ("median", "min", "max"))]
            for kind in runs for key in ("first_step_s", "wall_s", "overhead_s")]
    rows.append(["cluster - local wall, burst by burst", *(f"{extra[k]:.2f}" for k in ("median", "min", "max"))])
    print(f"cluster start (2 nodes, loopback) and connect: {cluster_start_s:.1f} s")
    print(table(["seconds", "median", "min", "max"], rows))
    path = write_json("ray_cluster", {"repeats": args.repeats, "steps": args.steps, "workload": "mlp",
                                      "config": "ddp x 2, one rank per node (STRICT_SPREAD)",
                                      "cluster_start_s": cluster_start_s, "runs": runs, "stats": stats,
                                      "cluster_minus_local_wall_s": extra})
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
