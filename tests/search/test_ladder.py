import itertools

from accel_widgets import Config, classic_ladder
from accel_widgets.inputs.device import DeviceInfo, GpuInfo
from tests.workloads import conv_workload, tiny_workload

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
