import dataclasses
import itertools

from accel_widgets import BatchSizeSearch, Config, classic_ladder
from accel_widgets.inputs.device import DeviceInfo, GpuInfo
from accel_widgets.results.batchsize import BatchTry
from accel_widgets.search.ladder import Rung, ladder_pairs, run_ladder
from tests.search.machines import Machine, noisy
from tests.workloads import conv_workload, gpt_workload, tiny_workload

CPU = DeviceInfo(cpu_count=2, cpu_name="cpu", cpu_flags=frozenset({"avx512_bf16"}))
GPU = DeviceInfo(cpu_count=16, cpu_name="host", gpus=(GpuInfo(0, 0, "NVIDIA H200", 1),))


def test_the_ladder_is_cumulative_in_the_classic_order():
    rungs = classic_ladder(tiny_workload(), CPU)
    assert [r.name for r in rungs] == ["baseline", "+loader", "+bf16", "+compile", "+rest"]
    assert rungs[0].config == Config()
    for earlier, later in itertools.pairwise(rungs):
        assert set(earlier.config.diff()) <= set(later.config.diff())
    assert rungs[-1].config.compile_mode == "default" and not rungs[-1].config.channels_last


def test_without_compile_no_rung_compiles():
    rungs = classic_ladder(tiny_workload(), CPU, leave_out={"+compile"})
    assert "+compile" not in [r.name for r in rungs]
    assert all(r.config.compile_mode == "off" for r in rungs)


def test_gpu_rungs_add_pinned_memory_cudnn_and_channels_last_for_convs():
    rest = classic_ladder(conv_workload(), GPU)[-1].config
    assert rest.pin_memory and rest.non_blocking and rest.cudnn_benchmark and rest.tf32 and rest.channels_last
    assert rest.optimizer_impl == "fused" and rest.precision == "bf16"


def test_a_gpu_without_bf16_units_gets_fp16_with_gradscaler():
    t4 = DeviceInfo(cpu_count=8, cpu_name="host", gpus=(GpuInfo(0, 0, "Tesla T4", 1, compute_capability=(7, 5)),))
    rungs = classic_ladder(tiny_workload(), t4)
    assert [r.name for r in rungs] == ["baseline", "+loader", "+fp16", "+compile", "+rest"]
    assert rungs[-1].config.precision == "fp16"  # the engine adds GradScaler for fp16


def test_the_memory_rung_is_climbed_only_where_memory_is_the_limit():
    """Activation checkpointing costs a recompute: the ladder takes it after half precision (which may lift the limit
    by itself) and before compile, and only where the diagnosis read memory as full or out."""
    workload = gpt_workload(batch_size=4)
    assert "+memory" not in [r.name for r in classic_ladder(workload, CPU)]
    rungs = classic_ladder(workload, CPU, limits={"memory_full"})
    assert [r.name for r in rungs] == ["baseline", "+loader", "+bf16", "+memory", "+compile", "+rest"]
    memory = rungs[3].config
    assert memory.activation_checkpointing == "blocks" and rungs[2].config.activation_checkpointing == "off"
    assert rungs[-1].config.activation_checkpointing == "blocks"  # cumulative
    no_blocks = classic_ladder(tiny_workload(), CPU, limits={"out_of_memory"})
    assert "+memory" not in [r.name for r in no_blocks]


def test_a_batch_size_search_that_ran_out_of_memory_gives_the_memory_rung_its_batch_size():
    room = "activation_checkpointing=blocks"
    tries = (BatchTry(256, True, "grow", samples_per_s=900.0, within_margin=True),
             BatchTry(512, True, "grow", samples_per_s=1000.0, within_margin=True),
             BatchTry(1024, False, "grow", "oom"),
             BatchTry(1024, True, "grow", samples_per_s=800.0, within_margin=True, setting=room),
             BatchTry(2048, False, "grow", "oom", setting=room))
    search = BatchSizeSearch("gpt", Config(), "GPU", "cuda_allocator", None, "", "per step", tries,
                             room_config=Config(activation_checkpointing="blocks"))
    assert search.memory_limited
    rungs = classic_ladder(gpt_workload(batch_size=4), CPU, batch_search=search)
    memory = next(r for r in rungs if r.name == "+memory")
    assert (memory.config.activation_checkpointing, memory.config.batch_size) == ("blocks", 1024)
    assert "the batch size that then fits (activation_checkpointing=blocks, find_batch_size)" in memory.why
    flat = dataclasses.replace(search, tries=(*tries[:1], dataclasses.replace(tries[1], samples_per_s=800.0),
                                              *tries[2:]))
    assert not flat.memory_limited  # the fastest size was not the largest: a larger batch would not pay
    assert "+memory" not in [r.name for r in classic_ladder(gpt_workload(batch_size=4), CPU, batch_search=flat)]


def test_a_ladder_reads_each_rung_against_the_one_before_and_the_baseline() -> None:
    """Rungs at 1.0x, 1.5x and 1.5x: the second rung is faster than the baseline, the third no faster than the
    second (same) but faster than the baseline; each rung's first burst is told as it ends."""
    rungs = [Rung("baseline", "", Config()), Rung("+loader", "", Config(num_workers=2)),
             Rung("+pin", "", Config(num_workers=2, pin_memory=True))]
    machine = Machine(noisy({rungs[1].config: 1.5, rungs[2].config: 1.5}, sd=0.01))
    told: list[str] = []
    ladder = run_ladder(tiny_workload(), rungs, engine=machine, steps=10, budget_s=300.0,
                        on_result=lambda rung, result: told.append(rung.name))
    assert told == ["baseline", "+loader", "+pin"] and [r.config for r in ladder.results] == [r.config for r in rungs]
    assert sorted(ladder.comparisons) == [(0, 1), (0, 2), (1, 2)]
    assert ladder.step(1).verdict == "faster" and ladder.step(2).verdict == "same"
    assert ladder.overall(2).verdict == "faster" and ladder.overall(1) is ladder.step(1)
    assert ladder_pairs(4) == [(0, 1), (1, 2), (2, 3), (0, 2), (0, 3)]


def test_a_rung_whose_ceiling_reads_same_is_not_climbed_and_a_measured_one_reads_each_rung_against_it():
    from accel_widgets.search.ladder import Ladder, closed_rungs
    from accel_widgets.views.headspace import reached_text
    from tests.results.test_headspace import headspace_of

    flat = headspace_of({"data": [1.0, 1.01, 0.99, 1.0, 1.005]})
    rungs = classic_ladder(tiny_workload(), CPU, headspace=flat)
    assert [r.name for r in rungs] == ["baseline", "+bf16", "+compile", "+rest"]
    assert not rungs[-1].config.num_workers  # nothing of the loader's climbed later either
    ((title, ceiling),) = closed_rungs(tiny_workload(), CPU, headspace=flat)
    assert title == "+loader" and ceiling.closed_text.startswith("data loading costs at most 2% here")
    wide = headspace_of({"data": [2.0, 2.1, 2.05, 1.95]})
    climbed = classic_ladder(tiny_workload(), CPU, headspace=wide)
    assert [r.name for r in climbed] == ["baseline", "+loader", "+bf16", "+compile", "+rest"]
    ladder = Ladder(climbed, [], {}, wide)
    assert ladder.ceiling(1) is wide.ceilings["data"] and ladder.ceiling(2) is None
    from tests.results.test_headspace import ceiling_of

    rung = ceiling_of("data", [1.9, 1.9, 1.9, 1.9]).comparison
    assert reached_text("+loader", rung, ladder.ceiling(1)) == ("+loader reached 1.90× of a possible 2.02× (data "
                                                                "free)")
