import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from accel_widgets import BurstOptions, Config, run_burst
from accel_widgets.analysis.usage import mfu, mfu_basis
from accel_widgets.demos import resnet18
from accel_widgets.knobs.precision import op_math
from accel_widgets.metrics.flops import count_training_flops, peak_flops
from accel_widgets.results.burst import RankSummary
from accel_widgets.views.text import summary
from tests.devices import cpu_device
from tests.results.test_burst import make_result
from tests.workloads import tiny_workload

H200 = {"device_kind": "cuda", "device_name": "NVIDIA H200"}


def test_training_flops_of_a_first_linear_layer_are_four_per_weight_per_sample():
    """Forward 2*in*out per sample; backward only the weight gradient: the input needs none."""
    layer = nn.Linear(64, 32, bias=False)
    x, y = torch.randn(8, 64), torch.randn(8, 32)
    flops = count_training_flops(layer, lambda m: F.mse_loss(m(x), y), contextlib.nullcontext)
    assert flops.by_op == {("matmul", "float32"): 4 * 64 * 32 * 8} and flops.total == 4 * 64 * 32 * 8
    assert layer.weight.grad is None


def test_flops_are_split_by_op_class_and_the_dtype_autocast_ran_them_in():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    x, y = torch.randn(2, 3, 6, 6), torch.randint(0, 4, (2,))
    fp32 = count_training_flops(model, lambda m: F.cross_entropy(m(x), y), contextlib.nullcontext)
    # conv forward 2*27*8 per output pixel, backward only for the weight (the input needs no gradient)
    conv = 2 * (2 * 27 * 8 * 36 * 2)
    linear = 3 * (2 * 288 * 4 * 2)  # forward, the input's gradient and the weight's
    assert fp32.by_op == {("conv", "float32"): conv, ("matmul", "float32"): linear}
    bf16 = count_training_flops(model, lambda m: F.cross_entropy(m(x), y),
                                lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert bf16.by_op == {("conv", "bfloat16"): conv, ("matmul", "bfloat16"): linear}


@pytest.mark.parametrize(("config", "kind", "op", "dtype", "math"), [
    (Config(), "cuda", "conv", "float32", "tf32"),  # cuDNN may use TF32 for fp32 convolutions, as stock PyTorch
    (Config(), "cuda", "matmul", "float32", "fp32"),
    (Config(tf32=True), "cuda", "matmul", "float32", "tf32"),
    (Config(), "cpu", "conv", "float32", "fp32"),
    (Config(tf32=True), "cpu", "matmul", "float32", "fp32"),
    (Config(precision="bf16"), "cuda", "conv", "bfloat16", "bf16"),
    (Config(precision="fp16"), "cuda", "matmul", "float16", "fp16"),
    (Config(), "cuda", "matmul", "float64", "fp64"),
    (Config(precision="bf16", float8="tensorwise"), "cuda", "matmul", "float8_e4m3fn", "fp8"),
    (Config(precision="bf16", float8="rowwise"), "cuda", "matmul", "float8_e5m2", "fp8"),
])
def test_each_op_runs_in_the_math_its_class_dtype_and_the_tf32_knob_give(config, kind, op, dtype, math):
    assert op_math(config, kind, op, dtype) == math


def _measured(flops_by_math: dict[str, float], samples_per_s: float, config: Config | None = None):
    rank = RankSummary(0, measured_samples=int(samples_per_s), measured_s=1.0, peak_memory_bytes=0,
                       memory_kind="cuda_allocator", setup_s=0.0, first_step_s=0.0, device="NVIDIA H200",
                       flops_per_sample=sum(flops_by_math.values()), flops_by_math=flops_by_math)
    return make_result(config=config or Config(), world_size=1, ranks=[rank], environment=H200)


def test_a_conv_net_in_fp32_on_an_h200_is_charged_the_tf32_peak_for_its_convolutions():
    """ResNet-18's FLOPs counted for real: at a rate whose FLOP/s are 1.5x the fp32 peak (67 TFLOP/s), the
    old single-peak MFU read 150%; charging the convolutions TF32's 494.7 TFLOP/s reads what it is."""
    model, config = resnet18(num_classes=10), Config()
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
    counted = count_training_flops(model, lambda m: F.cross_entropy(m(x), y), contextlib.nullcontext)
    by_math: dict[str, float] = {}
    for (op, dtype), flops in counted.by_op.items():
        key = f"{op}:{op_math(config, 'cuda', op, dtype)}"
        by_math[key] = by_math.get(key, 0.0) + flops / 4
    assert set(by_math) == {"conv:tf32", "matmul:fp32"} and by_math["conv:tf32"] > 0.99 * sum(by_math.values())
    rate = 1.5 * 67e12 / sum(by_math.values())
    result = _measured(by_math, rate, config)
    assert result.achieved_flops_per_s / 67e12 == pytest.approx(1.5, rel=1e-3)
    expected = result.samples_per_s * (by_math["conv:tf32"] / 494.7e12 + by_math["matmul:fp32"] / 67e12)
    assert mfu(result) == pytest.approx(expected) and 0.2 < mfu(result) < 0.25
    assert mfu_basis(result) == "FLOPs: 100% convs in tf32, 0% matmuls in fp32"
    assert f"MFU {mfu(result):.1%} (FLOPs: 100% convs in tf32" in summary(result)


def test_mfu_is_none_when_any_of_the_math_has_no_peak():
    assert mfu(_measured({"matmul:fp64": 1e9}, 1000.0)) is None
    assert mfu(_measured({"conv:tf32": 1e9, "matmul:fp64": 1e6}, 1000.0)) is None


@pytest.mark.parametrize(
    ("name", "math", "tflops"),
    [("NVIDIA H200", "bf16", 989.4), ("NVIDIA H200 NVL", "bf16", 835.5), ("NVIDIA H200 NVL", "tf32", 417.5),
     ("NVIDIA H100 NVL", "fp32", 60.0), ("NVIDIA H100 80GB HBM3", "tf32", 494.7), ("NVIDIA H100 PCIe", "fp16", 756.0),
     ("NVIDIA A100-SXM4-80GB", "tf32", 156.0), ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
     ("NVIDIA L40S", "bf16", 362.0), ("NVIDIA L4", "bf16", 121.0), ("Tesla T4", "tf32", 8.1)],
)
def test_peak_table_picks_the_most_specific_gpu_and_math_mode(name, math, tflops):
    assert peak_flops(name, math) == pytest.approx(tflops * 1e12)


def test_unknown_devices_and_missing_modes_have_no_peak():
    assert peak_flops("AMD EPYC 9654", "fp32") is None
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None


def test_mfu_from_measured_rate_and_peak():
    rank = RankSummary(0, measured_samples=1000, measured_s=1.0, peak_memory_bytes=0, memory_kind="cuda_allocator",
                       setup_s=0.0, first_step_s=0.0, device="NVIDIA H200", flops_per_sample=1e9)
    result = make_result(config=Config(precision="bf16"), world_size=1, ranks=[rank],
                         environment={"device_kind": "cuda", "device_name": "NVIDIA H200"})
    assert result.achieved_flops_per_s == pytest.approx(1e12)
    assert mfu(result) == pytest.approx(1e12 / 989.4e12)  # stored without per-op math: the matmuls' math for all
    assert mfu_basis(result) == "FLOPs: 100% ops in bf16"
    cpu = make_result(ranks=[rank], world_size=1, environment={"device_kind": "cpu"})
    assert cpu.achieved_flops_per_s == pytest.approx(1e12) and mfu(cpu) is None


def test_bursts_report_flops_per_sample():
    result = run_burst(tiny_workload(), Config(), steps=3, options=BurstOptions(device=cpu_device()))
    # TinyNet 16->32->4: the first layer needs no input gradient (4 FLOPs per weight), the second does (6)
    assert result.ranks[0].flops_per_sample == pytest.approx(4 * 16 * 32 + 6 * 32 * 4)
    assert result.ranks[0].flops_by_math == {"matmul:fp32": pytest.approx(4 * 16 * 32 + 6 * 32 * 4)}
    assert result.achieved_flops_per_s > 0


# -- float8: torchao's tensors stand in for bf16 but multiply float8 -------------------------------------------------
class FakeFloat8(torch.Tensor):
    """torchao's float8 training tensor in miniature: float8 data and a scale inside, the high-precision dtype it
    stands in for outside (``dtype``), a matmul that runs on the data scaled back, and ``__tensor_flatten__`` naming
    the inner tensors, as a traceable subclass does."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: torch.Tensor, orig_dtype: torch.dtype):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=orig_dtype, device=data.device)

    def __init__(self, data: torch.Tensor, scale: torch.Tensor, orig_dtype: torch.dtype) -> None:
        self._data, self._scale = data, scale

    def __tensor_flatten__(self):
        return ["_data", "_scale"], {"orig_dtype": self.dtype}

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.t.default:
            (tensor,) = args
            return FakeFloat8(tensor._data.t(), tensor._scale, tensor.dtype)

        def high_precision(arg):
            return arg._data.to(arg.dtype) * arg._scale if isinstance(arg, FakeFloat8) else arg

        return func(*map(high_precision, args), **(kwargs or {}))


def to_float8(tensor: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> FakeFloat8:
    """Tensorwise scaling, as torchao's recipe: one scale maps the tensor's largest magnitude to the format's."""
    scale = tensor.abs().amax().float().clamp(min=1e-12) / torch.finfo(dtype).max
    return FakeFloat8((tensor.float() / scale).to(dtype), scale, tensor.dtype)


class Float8Matmul(torch.autograd.Function):
    """``x @ w.T`` with both sides cast to float8, and the two gradient matmuls with the gradient in e5m2: the three
    matmuls of torchao's Float8Linear."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return torch.mm(to_float8(x), to_float8(weight).t())

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad8 = to_float8(grad, torch.float8_e5m2)
        return torch.mm(grad8, to_float8(weight)), torch.mm(grad8.t(), to_float8(x))


class Float8Mlp(nn.Module):
    """gpu_modern.py's MLP stack (Llama-3-8B's 4096 -> 14336 -> 4096, two residual blocks) with float8 matmuls."""

    def __init__(self, blocks: int = 2, width: int = 4096, hidden: int = 14336, device: str = "meta") -> None:
        super().__init__()
        self.weights = nn.ParameterList(
            nn.Parameter(torch.empty(shape, device=device, dtype=torch.bfloat16))
            for _ in range(blocks) for shape in ((hidden, width), (width, hidden)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for up, down in zip(self.weights[::2], self.weights[1::2], strict=True):
            x = x + Float8Matmul.apply(F.silu(Float8Matmul.apply(x, up)), down)
        return x


def test_a_fake_float8_matmul_computes_the_product_it_stands_for():
    """The fake runs the real arithmetic: float8 rounding keeps a product within a few percent of bf16's."""
    x, w = torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(32, 128, dtype=torch.bfloat16)
    product = Float8Matmul.apply(x, w)
    reference = (x.float() @ w.float().T)
    assert product.dtype == torch.bfloat16
    assert (product.float() - reference).norm() / reference.norm() < 0.08


def test_float8_tensors_flops_are_charged_the_fp8_peak_not_the_bf16_one():
    """The float8 MLP stack at H200 size (8,192 tokens a step), counted on the meta device: all 12 matmuls are
    float8 (e4m3 forward, e5m2 gradients). At 9 ms a step on an H200 the bf16 peak would read MFU 1.3; the fp8 peak
    (1,979 TFLOP/s) reads 0.65."""
    tokens, model, config = 8192, Float8Mlp(), Config(precision="bf16", float8="tensorwise")
    x = torch.empty(tokens, 4096, device="meta", dtype=torch.bfloat16, requires_grad=False)
    counted = count_training_flops(model, lambda m: m(x).float().square().mean(), contextlib.nullcontext)
    per_matmul = 2 * tokens * 4096 * 14336
    assert counted.by_op == {("matmul", "float8_e4m3fn"): 4 * per_matmul,  # the forward
                             ("matmul", "float8_e5m2"): 8 * per_matmul}  # each input's and weight's gradient
    by_math: dict[str, float] = {}
    for (op, dtype), flops in counted.by_op.items():
        key = f"{op}:{op_math(config, 'cuda', op, dtype)}"
        by_math[key] = by_math.get(key, 0.0) + flops / tokens
    assert by_math == {"matmul:fp8": pytest.approx(12 * per_matmul / tokens)}
    result = _measured(by_math, tokens / 0.009, config)
    assert result.achieved_flops_per_s / 989.4e12 == pytest.approx(1.30, abs=0.01)  # what the bf16 peak would say
    assert mfu(result) == pytest.approx(result.achieved_flops_per_s / 1979e12) and 0.64 < mfu(result) < 0.66
    assert mfu_basis(result) == "FLOPs: 100% matmuls in fp8"


@pytest.mark.parametrize(("name", "tflops"), [("NVIDIA H200", 1979.0), ("NVIDIA H100 80GB HBM3", 1979.0),
                                              ("NVIDIA H200 NVL", 1670.0), ("NVIDIA H100 NVL", 1670.0),
                                              ("NVIDIA L40S", 733.0), ("NVIDIA L4", 242.5)])
def test_the_float8_peaks_are_the_dense_ones(name, tflops):
    assert peak_flops(name, "fp8") == pytest.approx(tflops * 1e12)
    assert peak_flops("NVIDIA A100-SXM4-80GB", "fp8") is None  # no float8 tensor cores before Ada
