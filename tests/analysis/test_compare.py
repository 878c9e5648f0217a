"""One result against another: the lone speed-up, memory per rank, scaling over ranks and the straggler."""

import dataclasses

import pytest

from accel_widgets import Config
from accel_widgets.analysis.compare import (
    comparison_rows,
    memory_ratio,
    scaling_efficiency,
    speedup,
    straggler,
    straggler_rank,
)
from tests.analysis.test_usage import _cuda_rank
from tests.results.test_burst import _rank, make_result


def test_speedup_is_samples_per_s_over_the_baselines():
    fast, slow = make_result(), make_result(ranks=[_rank(0, 96, 0.6), _rank(1, 96, 1.0)])
    assert speedup(fast, slow) == pytest.approx(2.0, rel=0.01)
    assert speedup(fast, make_result(ranks=[])) is None  # no throughput to divide by


def test_the_straggler_is_the_slowest_rank():
    assert straggler_rank(make_result()) == 1
    assert straggler_rank(make_result(ranks=[_rank(0, 96, 0.3)])) is None  # one rank: nobody to wait for


def paced(busy: list[float], nodes: tuple[str, ...] = ("node-a", "node-b", "node-c")) -> list:
    """Ranks whose windows agree (DDP) and whose own work differs: ``busy`` seconds each over the window."""
    return [dataclasses.replace(_rank(rank, 96, 0.5), busy_s=seconds, node=nodes[rank])
            for rank, seconds in enumerate(busy)]


def test_under_ddp_the_straggler_is_the_rank_with_the_most_work_of_its_own():
    """Every rank's step ends at the same all-reduce: their throughputs agree, their own work does not."""
    found = straggler(make_result(ranks=paced([0.6, 0.3])))
    assert (found.rank, found.node) == (0, "node-a")
    assert found.busy_step_s == pytest.approx(0.2) and found.ratio == pytest.approx(2.0)  # 3 measured steps each
    assert straggler_rank(make_result(ranks=paced([0.3, 0.6]))) == 1
    assert straggler(make_result()) is None  # ranks that did not measure their own work (a result stored before)


def on_cluster(result, nodes: tuple[str, ...] = ("node-a", "node-b")):
    """``result`` as a burst on a Ray cluster reads: its ranks' actors on ``nodes``."""
    ranks = [dataclasses.replace(rank, node=node) for rank, node in zip(result.ranks, nodes, strict=True)]
    return dataclasses.replace(result, environment={**result.environment, "start_method": "ray actor"}, ranks=ranks)


def test_a_run_on_a_cluster_says_so_and_is_never_the_noise_floor_of_the_same_config_run_here():
    """The same config on two Ray nodes and on this machine are two measurements: the row says where it ran, its
    baseline is one of its own place where there is one (a comparison interleaves its bursts in one place), and
    against a baseline elsewhere its speed-up is a speed-up, never "same config" (the machine's noise floor)."""
    here, batch = make_result(), make_result(config=Config(compile_mode="default", batch_size=64))
    there = on_cluster(here)
    rows = comparison_rows([here, there, on_cluster(batch), on_cluster(here, ("node-a", "node-a"))])
    assert [row["changes"] for row in rows] == ["baseline", "baseline, on 2 Ray nodes", "batch_size=64, on 2 Ray nodes",
                                                "baseline, on 1 Ray node"]
    assert [row["baseline"] for row in rows] == [0, 1, 1, 1]
    assert [row["same_config"] for row in rows] == [False, False, False, False]  # a node less is another place
    alone = comparison_rows([on_cluster(batch), here, on_cluster(here)], baseline=here)  # an explicit one: everyone's
    assert [row["changes"] for row in alone] == ["batch_size=64, on 2 Ray nodes", "baseline",
                                                 "baseline, on 2 Ray nodes"]
    assert [row["same_config"] for row in alone] == [False, False, False]
    first = comparison_rows([on_cluster(batch), here])  # the cluster's only run is its baseline; here has its own
    assert [row["baseline"] for row in first] == [0, 1]
    assert comparison_rows([here], baseline=there)[0]["changes"] == "on this machine"


def test_scaling_efficiency_is_throughput_per_rank_against_one_rank():
    double, single = make_result(), make_result(world_size=1, ranks=[_rank(0, 96, 0.3)])
    assert scaling_efficiency(double, single) == pytest.approx((96 / 0.3 + 96 / 0.5) / (2 * 96 / 0.3))
    assert scaling_efficiency(single, single) == pytest.approx(1.0)


def test_memory_per_rank_compares_only_what_was_measured_the_same_way():
    ddp = make_result(ranks=[_cuda_rank(0, 80_000, 90_000, 64_000), _cuda_rank(1, 80_000, 90_000, 64_000)])
    fsdp = make_result(ranks=[_cuda_rank(0, 48_000, 52_000, 32_000), _cuda_rank(1, 50_000, 52_000, 32_000)],
                       config=Config(parallel="fsdp", world_size=2))
    assert memory_ratio(fsdp, ddp) == pytest.approx(50_000 / 80_000)
    assert memory_ratio(fsdp, make_result()) is None  # RSS against the allocator's peak: not comparable
