"""``aw.estimate``: one step traced on fake tensors, held to a real step's peak on this CPU, read per rank and against a
named GPU, with the largest batch and a roofline bound."""

from __future__ import annotations

import time

import pytest
import torch

from accel_widgets import Config, ConfigError, Workload
from accel_widgets.analysis.estimate import estimate
from accel_widgets.demos import demo_workload
from accel_widgets.inputs.device import DeviceInfo
from accel_widgets.metrics.gpus import gpu_spec
from accel_widgets.views.estimate import estimate_lines, fit_text, measured_text
from tests.analysis.tracked_step import tracked_peak
from tests.workloads import gpt_workload, hf_bert_workload, hf_gpt2_workload

CPU = DeviceInfo(2, "a CPU", frozenset({"avx512_bf16"}))


def small_bert() -> Workload:
    return hf_bert_workload(layers=2, hidden=64, heads=2, vocab_size=512, seq_len=64, batch_size=8)


@pytest.mark.parametrize(("name", "config"), [("mlp", Config()), ("mlp", Config(precision="bf16")),
                                              ("lm", Config(activation_checkpointing="blocks")),
                                              ("gpt", Config(activation_checkpointing="blocks")),
                                              ("gpt", Config(precision="bf16")),
                                              ("bert", Config(precision="bf16", activation_checkpointing="blocks")),
                                              ("image", Config(channels_last=True))])
def test_the_estimate_is_within_15_percent_of_a_real_steps_tracked_peak(name, config) -> None:
    """The issue's bar, on the small ones here (the demos, GPT-2 and BERT in fp32 and bf16, with and without
    checkpointing, are in benchmarks/estimate_accuracy.py). A checkpointed step's peak is the hard one: the blocks
    recomputed in backward must be freed as the real step frees them (the LM demo's read 29% high, then 15% low, before
    the FLOP counter stopped holding them and the peak's clock counted frees)."""
    workloads = {"mlp": lambda: demo_workload("mlp"), "lm": lambda: demo_workload("lm"), "bert": small_bert,
                 "image": lambda: demo_workload("image"),
                 "gpt": lambda: gpt_workload(n_layer=4, batch_size=32)}
    workload = workloads[name]()
    found = estimate(workload, config, device=CPU)
    real = tracked_peak(workload, config, found.batch_size)
    assert found.peak.tensors == pytest.approx(real, rel=0.15)
    if name in ("lm", "gpt", "bert"):
        assert found.peak.tensors == pytest.approx(real, rel=0.02)  # what it reaches on transformers (see the table)
    assert found.peak.process > 0 and found.peak.slack == 0  # a CPU: the rank's process, no CUDA allocator


def test_checkpointing_keeps_fewer_activations_and_moves_more_bytes() -> None:
    workload = gpt_workload(n_layer=4, batch_size=32)
    plain, recomputed = (estimate(workload, Config(activation_checkpointing=mode), device=CPU)
                         for mode in ("off", "blocks"))
    assert recomputed.peak.activations < 0.6 * plain.peak.activations
    assert recomputed.peak.parameters == plain.peak.parameters and recomputed.bytes_moved > plain.bytes_moved


def test_on_a_named_gpu_it_fits_with_room_its_largest_batch_is_on_the_line_and_its_bound_is_a_bound() -> None:
    workload = gpt_workload(n_layer=4, batch_size=32)
    found = estimate(workload, Config(precision="bf16"), device="H100 80GB")
    assert found.device == "NVIDIA H100 80GB HBM3" and found.fits and found.within_margin
    assert found.peak.slack > 0 and found.peak.process == 0  # the CUDA allocator's rounding, no process
    room = gpu_spec("H100 80GB").memory_bytes * (1 - found.margin)
    assert found.peak_at(found.largest_batch) <= room < found.peak_at(found.largest_batch + 1)
    assert found.bound_by in ("compute", "memory") and 0 < found.step_time_bound_s < 1
    assert set(found.flops_by_math) <= {"matmul:bf16", "matmul:fp32", "matmul:tf32"}
    assert fit_text(found).startswith("fits on NVIDIA H100 80GB HBM3 with ")
    lines = estimate_lines(found)
    assert "a bound, not a prediction" in lines[3] and lines[2].strip().startswith("largest batch leaving 10% free:")


def test_the_line_reads_another_batch_as_a_second_trace_does() -> None:
    workload = gpt_workload(n_layer=4, batch_size=16)
    line = estimate(workload, Config(), device="L4")
    traced = estimate(workload, Config(batch_size=64), device="L4")
    assert line.peak_at(64) == pytest.approx(traced.peak_bytes, rel=0.05)


def test_per_rank_ddp_adds_its_buckets_and_fsdp_divides_the_state() -> None:
    workload = gpt_workload(n_layer=4, batch_size=32)
    one = estimate(workload, Config(), device="A100 80GB")
    ddp = estimate(workload, Config(parallel="ddp", world_size=2), device="A100 80GB")
    fsdp = estimate(workload, Config(parallel="fsdp", world_size=4), device="A100 80GB")
    weights = sum(p.numel() * p.element_size() for p in workload.build_model().parameters())
    assert one.peak.parameters == weights and one.peak.parallel == 0
    assert ddp.ranks == 2 and ddp.peak.parallel == weights  # one bucketed copy of every gradient
    assert ddp.peak.optimizer == one.peak.optimizer and ddp.peak_bytes == one.peak_bytes + weights
    assert fsdp.peak.parameters == weights // 4
    assert fsdp.peak.optimizer == pytest.approx(one.peak.optimizer / 4, rel=0.01)
    assert 0 < fsdp.peak.parallel < weights  # two blocks and the root gathered, not the whole model


def test_what_cannot_be_asked_is_refused_naming_what_can() -> None:
    workload = gpt_workload(n_layer=2, batch_size=8)
    with pytest.raises(ValueError, match="the named GPUs are H100 80GB"):
        estimate(workload, device="B200")
    with pytest.raises(ConfigError):
        estimate(workload, Config(parallel="fsdp", world_size=2, precision="fp16"), device="H100")


def test_a_measured_peak_reads_against_the_estimate_like_with_like() -> None:
    workload = gpt_workload(n_layer=2, batch_size=8)
    found = estimate(workload, device=CPU)
    assert measured_text(found, int(found.peak_bytes * 1.1), "rss").endswith("(+10%)")
    assert "not comparable" in measured_text(found, found.peak_bytes, "cuda_allocator")
    gpu = estimate(workload, device="L4")
    tensors = gpu.peak_bytes - gpu.peak.slack
    assert gpu.error_of(int(tensors * 0.95), "cuda_allocator") == pytest.approx(-0.05, abs=1e-6)


def test_an_h100_estimate_of_gpt2_returns_within_seconds_without_a_gpu() -> None:
    """The issue's bar: transformers' GPT-2 (124M parameters, random weights from its config) asked about on an H100
    from this laptop, in bf16: 8 x 1024 tokens fit with room, checkpointing frees most of the activations."""
    pytest.importorskip("transformers")
    started = time.perf_counter()
    found = estimate(hf_gpt2_workload(), Config(precision="bf16"), device="H100 80GB")
    assert found.trace_s < 10 and time.perf_counter() - started < 10
    assert found.peak.parameters == pytest.approx(124.4e6 * 4, rel=0.01)  # fp32 weights (tied head counted once)
    assert found.fits and 16 < found.largest_batch < 40 and found.phase == "backward"


def test_the_cli_says_the_estimate_in_one_line_and_in_detail(capsys: pytest.CaptureFixture[str]) -> None:
    """``accel-widgets estimate``: no burst, one line (the fit, the largest batch, the bound), or the details."""
    from accel_widgets.cli import main

    assert main(["estimate", "--demo", "lm", "--device", "H100 80GB", "--precision", "bf16"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("lm-small (precision=bf16): fits on NVIDIA H100 80GB HBM3 with ")
    assert "; largest batch leaving 10% free: " in out[0] and out[0].endswith("a bound, not a prediction")
    assert main(["estimate", "--demo", "mlp", "--details"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("mlp-small (baseline): fits on this machine") and "MiB" in lines[1]
    assert lines[3] == "  no lower bound on the step's time: no peak FLOP/s or bandwidth known for a CPU"


def test_the_report_says_the_estimate_and_the_ceilings_before_the_comparison(tmp_path) -> None:
    from accel_widgets.views.report import write_report
    from tests.results.test_headspace import headspace_of
    from tests.views.test_report import make_result

    found = estimate(demo_workload("mlp"), device="L4")
    room = headspace_of({"data": [2.0, 2.2, 2.1, 1.9, 2.05]}, communication="one process")
    page = write_report([make_result()], tmp_path / "r.html", estimates=[found], headspaces=[room]).read_text()
    section = page[page.index("<h2>Before tuning</h2>"):page.index("<h2>Comparison</h2>")]
    assert "Ceilings (1× to 4×, log)" in section and section.count('class="aw-ceiling"') == 2
    assert "Data free: " in section and "can win at most" in section and "Communication free: not measured" in section
    assert "mlp-small (baseline): fits on NVIDIA L4 with " in section
    assert "<h2>Before tuning</h2>" not in write_report([make_result()], tmp_path / "s.html").read_text()


def test_a_model_handed_in_as_an_instance_is_estimated_as_its_factory_is_and_left_untouched() -> None:
    """``Workload(model=MyNet())``, the README's first form: the instance is copied with fakes of its weights (a tie
    kept), never its real data, and reads as the same model built by a factory does."""
    from tests.workloads import TinyNet, tiny_workload

    torch.manual_seed(0)
    instance = TinyNet()
    instance.tied = instance.hidden.weight  # a second name for one weight: counted once
    weights = [p.detach().clone() for p in instance.parameters()]
    found = estimate(tiny_workload(instance), device=CPU)
    assert found.peak.tensors == estimate(tiny_workload(), device=CPU).peak.tensors
    assert found.peak.parameters == sum(p.numel() * 4 for p in instance.parameters())
    assert all(torch.equal(p, w) and p.grad is None for p, w in zip(instance.parameters(), weights, strict=True))
