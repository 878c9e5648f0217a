"""A short soak (issue #9): a dozen random bursts in this process leave nothing behind in it.

The full soak is ``benchmarks/soak.py`` (200 bursts); this runs its planning and measuring code on the
test workloads, with exact no-growth asserts: after the first bursts (one of each kind, on one and two
ranks), no later burst may leave one more file descriptor, thread or child process, and no burst may
leave a temp file.
"""

from __future__ import annotations

import pytest

from accel_widgets import Workload, probe_device
from tests.benchmark_scripts import load_benchmark
from tests.workloads import FailAt, tiny_workload

BURSTS, SEED = 12, 1


soak = load_benchmark("soak")


def workload_for(plan) -> Workload:
    """The test suite's tiny workloads; a fail plan's model raises "deliberate failure" at its drawn call."""
    if plan.kind == "fail":
        return tiny_workload(FailAt("raise", at_call=plan.fail_at, rank=plan.fail_rank))
    return tiny_workload()


def test_plans_are_valid_seeded_and_cover_every_kind():
    device = probe_device()
    plans = soak.draw_plans(BURSTS, SEED, device, tiny_workload())
    assert plans == soak.draw_plans(BURSTS, SEED, device, tiny_workload())
    assert [(p.kind, p.ranks) for p in plans[:6]] == [(k, 2 if ddp else 1) for k, ddp in soak.COVER]
    assert all(p.config.compile_mode == "off" and 2 <= p.steps <= 6 for p in plans)
    assert all(p.fail_at is not None for p in plans if p.kind == "fail")


@pytest.mark.slow
def test_a_dozen_random_bursts_leave_nothing_behind():
    plans = soak.draw_plans(BURSTS, SEED, probe_device(), tiny_workload())
    records = soak.soak(plans, workload_for)
    unexpected = [(r["index"], r["kind"], r["config"], r["status"], r["error"]) for r in records if not r["expected"]]
    assert not unexpected
    settle = len(soak.COVER)
    grown = soak.growth([r["snapshot"] for r in records], settle - 1)
    history = {m: [r["snapshot"][m] for r in records] for m in ("fds", "threads", "children")}
    for metric in ("fds", "threads", "children"):
        assert grown[metric].growth <= 0, f"{metric} grew after burst {settle}: {history[metric]}"
    assert history["children"][-1] == 0
    assert [r["snapshot"]["temp_files"] for r in records] == [0] * BURSTS
