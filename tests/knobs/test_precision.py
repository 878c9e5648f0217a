"""The precision module's global switches: ``Config()`` keeps stock TF32 settings; every switch is put back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from accel_widgets.knobs import global_flags
from accel_widgets.knobs.config import Config


def tf32_state() -> dict[str, object]:
    """Both views of the TF32 setting; reading the legacy ones raises if they disagree with the new ones."""
    backends = torch.backends
    return {
        "legacy_matmul": torch.get_float32_matmul_precision(),
        "legacy_matmul_allow": backends.cuda.matmul.allow_tf32,
        "legacy_cudnn_allow": backends.cudnn.allow_tf32,
        "cuda.matmul": backends.cuda.matmul.fp32_precision,
        "mkldnn.matmul": backends.mkldnn.matmul.fp32_precision,
        "cudnn.conv": backends.cudnn.conv.fp32_precision,
        "cudnn.rnn": backends.cudnn.rnn.fp32_precision,
    }


@pytest.fixture
def stock() -> Iterator[dict[str, object]]:
    """PyTorch's defaults as a fresh process has them, asserted, and put back after the test."""
    state = tf32_state()
    assert state == {"legacy_matmul": "highest", "legacy_matmul_allow": False, "legacy_cudnn_allow": True,
                     "cuda.matmul": "none", "mkldnn.matmul": "none", "cudnn.conv": "tf32", "cudnn.rnn": "tf32"}
    yield state
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.fp32_precision = "none"
    torch.backends.mkldnn.matmul.fp32_precision = "none"


def test_default_config_keeps_stock_tf32_settings_and_restores_them(stock: dict[str, object]) -> None:
    with global_flags(Config()):
        inside = tf32_state()
    # fp32 matmuls stay IEEE, cuDNN convolutions and RNNs keep TF32, as in a plain PyTorch script.
    assert inside["legacy_matmul"] == "highest" and inside["legacy_matmul_allow"] is False
    assert inside["cuda.matmul"] != "tf32"
    assert (inside["legacy_cudnn_allow"], inside["cudnn.conv"], inside["cudnn.rnn"]) == (True, "tf32", "tf32")
    assert tf32_state() == stock


def test_tf32_turns_on_matmuls_and_cudnn_together_with_both_apis_in_step(stock: dict[str, object]) -> None:
    with global_flags(Config(tf32=True)):
        inside = tf32_state()  # would raise on a legacy/new mismatch, as inductor's reads do
    assert (inside["legacy_matmul"], inside["legacy_matmul_allow"], inside["cuda.matmul"]) == ("high", True, "tf32")
    assert (inside["legacy_cudnn_allow"], inside["cudnn.conv"], inside["cudnn.rnn"]) == (True, "tf32", "tf32")
    assert inside["mkldnn.matmul"] != "tf32"  # a CUDA-only knob leaves CPU matmuls alone
    assert tf32_state() == stock


def test_default_config_resets_a_callers_changes_for_the_burst_and_gives_them_back(
    stock: dict[str, object],
) -> None:
    # The in-process fallback runs in the caller's interpreter, which may have its own settings.
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = False
    callers = tf32_state()
    with global_flags(Config()):
        inside = tf32_state()
    assert (inside["legacy_matmul_allow"], inside["legacy_cudnn_allow"]) == (False, True)
    assert (inside["cudnn.conv"], inside["cudnn.rnn"]) == ("tf32", "tf32")
    assert tf32_state() == callers


def test_settings_are_restored_when_the_burst_raises(stock: dict[str, object]) -> None:
    with pytest.raises(RuntimeError, match="boom"), global_flags(Config(tf32=True)):
        raise RuntimeError("boom")
    assert tf32_state() == stock
