import math
import re

import pytest

from accel_widgets import BurstOptions, Config, ConfigError, check_config, run_burst
from accel_widgets.cli import main
from accel_widgets.engine import ranks
from accel_widgets.engine.request import BurstRequestError, check_burst_request
from accel_widgets.inputs.device import DeviceInfo, GpuInfo
from accel_widgets.knobs.rules import knob_availability
from tests.workloads import tiny_workload

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


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graphs_with_gradient_accumulation_are_refused_on_a_gpu(mode):
    config = Config(compile_mode=mode, grad_accum_steps=4)
    with pytest.raises(ConfigError) as caught:
        check_config(config, ONE_GPU)
    message = str(caught.value)
    assert f"compile_mode={mode!r}" in message and "grad_accum_steps=4" in message
    assert "wrong gradients" in message and "#169545" in message and "#96693" in message
    assert "'max-autotune-no-cudagraphs' or 'default'" in message and "bigger batch_size" in message


def test_compile_and_accumulation_without_cuda_graphs_are_allowed():
    for config, device in [
        (Config(compile_mode="max-autotune-no-cudagraphs", grad_accum_steps=4), ONE_GPU),
        (Config(compile_mode="default", grad_accum_steps=4), ONE_GPU),
        (Config(compile_mode="reduce-overhead", grad_accum_steps=1), ONE_GPU),
        (Config(compile_mode="max-autotune", grad_accum_steps=4), CPU),  # no CUDA graphs on a CPU
    ]:
        check_config(config, device)  # does not raise


def test_bf16_on_a_gpu_without_bf16_units_warns_and_points_at_fp16():
    t4 = DeviceInfo(cpu_count=8, cpu_name="Host",
                    gpus=(GpuInfo(0, 0, "Tesla T4", 16 << 30, compute_capability=(7, 5)),))
    warnings = check_config(Config(precision="bf16"), t4)
    assert len(warnings) == 1
    assert "Tesla T4 (compute capability 7.5)" in warnings[0]
    assert "slow, emulated" in warnings[0] and "precision='fp16'" in warnings[0]
    assert check_config(Config(precision="fp16"), t4) == []
    a100 = DeviceInfo(cpu_count=8, cpu_name="Host", gpus=(GpuInfo(0, 0, "A100", 1, compute_capability=(8, 0)),))
    assert check_config(Config(precision="bf16"), a100) == []


def test_knob_availability_disables_cuda_only_knobs_on_cpu():
    assert knob_availability("pin_memory", CPU) == (False, "pin_memory only acts on CUDA; this machine is cpu.")
    assert knob_availability("pin_memory", ONE_GPU) == (True, "")
    assert knob_availability("num_workers", CPU)[0]


GOOD_REQUEST = {"steps": 10, "seconds": None, "warmup_steps": None, "timeout_s": 600.0, "profile_steps": 0}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seconds": math.nan}, "seconds=nan is invalid: use a finite number of seconds, seconds > 0"),
        ({"seconds": math.inf}, "seconds=inf is invalid"),
        ({"seconds": 0}, "seconds=0 is invalid"),
        ({"seconds": "5"}, "seconds='5' is invalid"),
        ({"timeout_s": 0}, "timeout_s=0 is invalid: use a finite number of seconds, timeout_s > 0"),
        ({"timeout_s": -1.0}, "timeout_s=-1.0 is invalid"),
        ({"timeout_s": math.nan}, "timeout_s=nan is invalid"),
        ({"timeout_s": None}, "timeout_s=None is invalid"),
        ({"steps": 2.5}, "steps=2.5 is invalid: use an integer, steps >= 1"),
        ({"steps": "3"}, "steps='3' is invalid: use an integer, steps >= 1"),
        ({"steps": True}, "steps=True is invalid"),
        ({"steps": 0}, "steps=0 is invalid"),
        ({"warmup_steps": 0}, "warmup_steps=0 is invalid: use an integer, warmup_steps >= 1: the first step always"),
        ({"warmup_steps": 1.0}, "warmup_steps=1.0 is invalid"),
        ({"profile_steps": -1}, "profile_steps=-1 is invalid: use an integer, profile_steps >= 0"),
        ({"profile_steps": 2.0}, "profile_steps=2.0 is invalid"),
    ],
)
def test_burst_request_rejects_unusable_numbers(changes, message):
    with pytest.raises(BurstRequestError) as info:
        check_burst_request(**{**GOOD_REQUEST, **changes})
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_burst_request_names_every_problem_and_accepts_good_numbers():
    with pytest.raises(BurstRequestError, match=r"steps=0 is invalid.*; profile_steps=-1 is invalid"):
        check_burst_request(**{**GOOD_REQUEST, "steps": 0, "profile_steps": -1})
    check_burst_request(**GOOD_REQUEST)
    check_burst_request(steps=None, seconds=0.5, warmup_steps=1, timeout_s=30, profile_steps=3)
    check_burst_request(steps=None, seconds=None, warmup_steps=None, timeout_s=1, profile_steps=0)  # default length


@pytest.fixture
def no_process_may_start(monkeypatch):
    """Every check must come before the launcher starts anything: starting is made an error."""

    def started(*args, **kwargs):
        raise AssertionError("run_burst started a process before rejecting its arguments")

    monkeypatch.setattr(ranks, "warm_up", started)
    monkeypatch.setattr(ranks, "start_ranks", started)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seconds": math.nan}, "seconds=nan is invalid"),
        ({"seconds": math.inf}, "seconds=inf is invalid"),
        ({"timeout_s": 0}, "timeout_s=0 is invalid"),
        ({"steps": 2.5}, "steps=2.5 is invalid"),
        ({"warmup_steps": True}, "warmup_steps=True is invalid"),
        ({"profile_steps": -1}, "profile_steps=-1 is invalid"),
        ({"steps": 5, "seconds": 2.0}, "steps=5 and seconds=2.0 given together: a burst measures either a number "
                                       "of steps or a time; pass one of them"),
    ],
)
def test_run_burst_rejects_bad_numbers_before_starting(no_process_may_start, kwargs, message):
    """The length is checked by ``run_burst``, the rest when its :class:`BurstOptions` is made: before either starts
    anything."""
    length = {name: value for name, value in kwargs.items() if name in ("steps", "seconds")}
    options = {name: value for name, value in kwargs.items() if name not in length}
    with pytest.raises(BurstRequestError, match=re.escape(message)):
        run_burst(tiny_workload(), Config(), **length, options=BurstOptions(**options))


def test_run_burst_names_config_or_options_when_given_a_dict(no_process_may_start):
    with pytest.raises(TypeError, match=r"config must be an accel_widgets\.Config, got dict: pass Config\("):
        run_burst(tiny_workload(), {"precision": "bf16"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"options must be an accel_widgets\.BurstOptions, got dict: pass "):
        run_burst(tiny_workload(), Config(), options={"timeout_s": 60})  # type: ignore[arg-type]


def test_cli_rejects_nan_seconds_and_negative_profile_steps(no_process_may_start, capsys):
    assert main(["run", "--demo", "mlp", "--seconds", "nan"]) == 2
    assert "seconds=nan is invalid" in capsys.readouterr().err
    assert main(["run", "--demo", "mlp", "--steps", "2", "--profile-steps", "-1"]) == 2
    assert "profile_steps=-1 is invalid" in capsys.readouterr().err
    assert main(["run", "--demo", "mlp", "--steps", "2", "--seconds", "1"]) == 2
    assert "steps=2 and seconds=1.0 given together" in capsys.readouterr().err

