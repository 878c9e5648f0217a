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
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.cudnn.conv.fp32_precision,
        torch.backends.cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    try:
        # Why: without TF32, fp32 matmuls/convs on Ampere+ GPUs run on the slow IEEE path.
        precision = "tf32" if config.tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
        # Why: benchmark mode times cuDNN algorithms once per shape and keeps the fastest.
        torch.backends.cudnn.benchmark = config.cudnn_benchmark
        if config.deterministic:
            # cuBLAS needs a fixed workspace to be deterministic; it must be set before its first use.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_DETERMINISTIC_WORKSPACE)
        torch.use_deterministic_algorithms(config.deterministic)
        yield
    finally:
        matmul, conv, benchmark, deterministic, workspace = saved
        torch.backends.cuda.matmul.fp32_precision = matmul
        torch.backends.cudnn.conv.fp32_precision = conv
        torch.backends.cudnn.benchmark = benchmark
        torch.use_deterministic_algorithms(deterministic)
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run with ``count`` intra-op threads: ranks sharing cores must not oversubscribe them."""
    saved = torch.get_num_threads()
    torch.set_num_threads(max(1, count))
    try:
        yield
    finally:
        torch.set_num_threads(saved)
