"""The named GPUs an estimate can be asked about: found as a person types them, their peaks from the one table."""

import pytest

from accel_widgets.metrics.flops import peak_flops
from accel_widgets.metrics.gpus import GPU_SPECS, gpu_spec, spec_of_device


@pytest.mark.parametrize(("name", "nvml"), [("H100 80GB", "NVIDIA H100 80GB HBM3"), ("h200", "NVIDIA H200"),
                                            ("A100 40GB", "NVIDIA A100-SXM4-40GB"),
                                            ("a100-80gb", "NVIDIA A100-SXM4-80GB"), ("L4", "NVIDIA L4"),
                                            ("RTX 4090", "NVIDIA GeForce RTX 4090")])
def test_the_issues_gpus_are_named_as_people_type_them_and_carry_memory_bandwidth_and_peaks(name, nvml):
    spec = gpu_spec(name)
    assert spec.name == nvml and spec_of_device(nvml) is spec
    assert spec.memory_bytes > 20 * 2**30 and spec.bandwidth_bytes_per_s > 2e11
    assert spec.peak("bf16") == peak_flops(nvml, "bf16") and spec.peak("tf32") and spec.peak("fp32")
    assert (spec.peak("fp8") is not None) == (spec.compute_capability >= (8, 9))


def test_the_h100_and_the_4090_read_their_own_rows_not_a_prefix() -> None:
    assert gpu_spec("H100 80GB").peak("bf16") == 989.4e12 and gpu_spec("H100 PCIe").peak("bf16") == 756.0e12
    assert gpu_spec("RTX 4090").peak("bf16") == 165.2e12  # half rate with fp32 accumulation
    assert len({spec.name for spec in GPU_SPECS}) == len(GPU_SPECS)


def test_an_unknown_gpu_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="no spec for a GPU named 'B200': the named GPUs are H100 80GB, H100 PCIe"):
        gpu_spec("B200")
