import pytest

from accel_widgets import Config, ConfigError, check_config
from accel_widgets.device import DeviceInfo, GpuInfo
from accel_widgets.validation import knob_availability

CPU = DeviceInfo(cpu_count=2, cpu_name="Test CPU", cpu_flags=frozenset({"avx512_bf16"}))
CPU_NO_BF16 = DeviceInfo(cpu_count=2, cpu_name="Old CPU")
ONE_GPU = DeviceInfo(cpu_count=16, cpu_name="Host", gpus=(GpuInfo(0, 0, "NVIDIA H200", 141 << 30),))
TWO_GPUS = DeviceInfo(cpu_count=16, cpu_name="Host", gpus=(GpuInfo(0, 0, "A", 1), GpuInfo(1, 1, "B", 1)))


def test_baseline_is_clean_everywhere():
    for device in (CPU, ONE_GPU, TWO_GPUS):
        assert check_config(Config(), device) == []


@pytest.mark.parametrize(
    ("config", "device", "reason"),
    [
        (Config(parallel="dataparallel"), ONE_GPU, "needs at least 2 GPUs; this machine has 1"),
        (Config(parallel="dataparallel"), CPU, "prefer parallel='ddp'"),
        (Config(parallel="ddp", world_size=4), TWO_GPUS, "one GPU per rank for NCCL"),
        (Config(world_size=2), CPU, "only applies with parallel='ddp'"),
        (Config(deterministic=True, cudnn_benchmark=True), ONE_GPU, "contradict"),
        (Config(deterministic=True, compile_mode="max-autotune"), CPU, "deterministic=True"),
    ],
)
def test_impossible_combinations_are_rejected_with_a_reason(config, device, reason):
    with pytest.raises(ConfigError, match=reason.replace("(", "\\(").replace(")", "\\)")):
        check_config(config, device)


def test_dataparallel_is_allowed_with_two_gpus():
    assert check_config(Config(parallel="dataparallel"), TWO_GPUS) == []


@pytest.mark.parametrize(
    ("config", "device", "warning"),
    [
        (Config(precision="fp16"), CPU, "11-130x slower"),
        (Config(precision="bf16"), CPU_NO_BF16, "emulated"),
        (Config(pin_memory=True), CPU, "pin_memory only act on CUDA"),
        (Config(persistent_workers=True), CPU, "only apply with num_workers > 0"),
        (Config(non_blocking=True), ONE_GPU, "without pin_memory"),
        (Config(compile_mode="reduce-overhead"), CPU, "same as 'default'"),
        (Config(parallel="ddp", world_size=4), CPU, "fight for cores"),
    ],
)
def test_allowed_but_pointless_combinations_warn_why(config, device, warning):
    assert any(warning in w for w in check_config(config, device))


def test_fp16_on_a_gpu_does_not_warn():
    assert check_config(Config(precision="fp16"), ONE_GPU) == []


def test_knob_availability_disables_cuda_only_knobs_on_cpu():
    assert knob_availability("pin_memory", CPU) == (False, "pin_memory only acts on CUDA; this machine is cpu.")
    assert knob_availability("pin_memory", ONE_GPU) == (True, "")
    assert knob_availability("num_workers", CPU)[0]
