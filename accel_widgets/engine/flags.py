"""Global torch switches, changed only inside context managers that put them back.

Workers are fresh processes, but the in-process fallback runs in the caller's interpreter, so every
global a burst touches (TF32, cuDNN, determinism, thread count) is saved and restored here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..config import Config

_CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"


@contextmanager
def torch_flags(config: Config) -> Iterator[None]:
    """Apply the config's global switches (TF32, cudnn.benchmark, determinism) for the duration."""
    saved = (
        torch.backends.cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    try:
        # Why: benchmark mode times cuDNN algorithms once per shape and keeps the fastest.
        torch.backends.cudnn.benchmark = config.cudnn_benchmark
        if config.deterministic:
            # cuBLAS needs a fixed workspace to be deterministic; it must be set before its first use.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_DETERMINISTIC_WORKSPACE)
        torch.use_deterministic_algorithms(config.deterministic)
        with _tf32(config.tf32):
            yield
    finally:
        benchmark, deterministic, workspace = saved
        torch.backends.cudnn.benchmark = benchmark
        torch.use_deterministic_algorithms(deterministic)
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace


@contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """TF32 for fp32 matmuls when ``enabled``; otherwise PyTorch's own defaults. Restores everything.

    Stock PyTorch runs fp32 matmuls in IEEE fp32 but lets cuDNN convolutions and RNNs use TF32, so
    ``Config()`` keeps exactly that: forcing convolutions to IEEE would slow the baseline of every
    conv net and inflate each ratio measured against it. ``enabled`` adds TF32 matmuls.

    Written through the ``allow_tf32`` switches because, up to torch 2.13 at least, they keep both views
    of the setting in step (they also set the per-op ``fp32_precision``; ``cudnn.allow_tf32`` sets conv
    and rnn together), and ``cuda.matmul`` leaves CPU (oneDNN) matmuls alone as a CUDA-only knob must.
    Writing ``fp32_precision`` directly leaves ``torch.get_float32_matmul_precision()`` and
    ``cudnn.allow_tf32`` raising a "mix of the legacy and new APIs" error, and inductor still reads
    them while compiling (pytorch/pytorch#189955). On exit the legacy values go back first, then the
    per-op ones (torch >= 2.9), so the caller gets back exactly the strings it had ("none", not the
    "ieee" the legacy setters write).
    """
    ops = (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul, torch.backends.cudnn.conv,
           torch.backends.cudnn.rnn)
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    per_op = [op.fp32_precision for op in ops]
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn
        for op, value in zip(ops, per_op, strict=True):
            op.fp32_precision = value


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run with ``count`` intra-op threads: ranks sharing cores must not oversubscribe them."""
    saved = torch.get_num_threads()
    torch.set_num_threads(max(1, count))
    try:
        yield
    finally:
        torch.set_num_threads(saved)
