"""The compute-bound demo: tabular regression with tensors already in memory, so the step is pure compute."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from ..inputs.workload import Workload

_MLP_DATA_TAG = 301


def regression_data(num_samples: int, num_features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 features ``(N, F)`` and unit-variance targets ``(N, 1)`` from a linear plus sinusoidal ground truth.

    The linear part is learnt in a few steps (a quick loss drop for tests); the nonlinear part leaves
    headroom for a longer run.
    """
    rng = np.random.default_rng((seed, _MLP_DATA_TAG))
    x = rng.standard_normal((num_samples, num_features), dtype=np.float32)
    w = rng.standard_normal(num_features).astype(np.float32) / math.sqrt(num_features)
    u = rng.standard_normal((num_features, 16)).astype(np.float32) / math.sqrt(num_features)
    v = rng.standard_normal(16).astype(np.float32) / 4.0
    y = x @ w + np.sin(2.0 * (x @ u)) @ v + 0.1 * rng.standard_normal(num_samples, dtype=np.float32)
    y = (y - y.mean()) / max(float(y.std()), 1e-6)
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.float32)).unsqueeze(1)


class MLP(nn.Module):
    """Stack of Linear-ReLU layers and a linear output: pure matmuls, the compute-bound end of the demos."""

    def __init__(self, in_features: int, hidden: int, depth: int, out_features: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def mlp_workload(size: str, num_samples: int | None, seed: int) -> Workload:
    """Tabular regression: tensors already in memory, so the step is pure compute."""
    if size == "small":
        features, hidden, depth, n, batch = 64, 256, 3, 8192, 256
    else:
        features, hidden, depth, n, batch = 128, 4096, 3, 65536, 1024
    n = num_samples if num_samples is not None else n
    x, y = regression_data(n, features, seed)
    return Workload(
        model=functools.partial(MLP, features, hidden, depth, 1),
        dataset=TensorDataset(x, y),
        loss_fn=F.mse_loss,
        name=f"mlp-{size}",
        batch_size=batch,
        seed=seed,
        metadata={"demo": "mlp", "size": size, "features": features, "hidden": hidden, "depth": depth},
    )
