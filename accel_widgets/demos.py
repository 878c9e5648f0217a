"""Ready-made demo workloads: a data-bound image classifier, a causal language model and a tabular MLP.

Every dataset is generated from a seed (no downloads, no torchvision) with structure a model can learn, and
every class and function lives at module level so a :class:`~accel_widgets.workload.Workload` travels to
worker processes by reference under ``pickle`` and ``cloudpickle``. Models are zero-argument factories
(``functools.partial`` of a module-level class), so workers build them under the workload seed.

Sizes: ``"small"`` runs on a laptop CPU in seconds (tests, smoke runs); ``"gpu"`` is sized for one modern
accelerator (ResNet-18, GPT-2 small, a wide MLP).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from .workload import Workload

__all__ = [
    "DEMO_NAMES",
    "DEMO_SIZES",
    "MLP",
    "AugmentedImages",
    "BasicBlock",
    "Block",
    "CausalSelfAttention",
    "ResNet",
    "SmallCNN",
    "TinyGPT",
    "TokenWindows",
    "demo_workload",
    "lm_loss",
    "markov_tokens",
    "regression_data",
    "resnet18",
    "synthetic_images",
]

DEMO_NAMES: tuple[str, ...] = ("image", "lm", "mlp")
DEMO_SIZES: tuple[str, ...] = ("small", "gpu")
DemoSize = Literal["small", "gpu"]

# Distinct SeedSequence tags keep each generator's stream independent of the others and of the per-item ones.
_IMAGE_DATA_TAG = 101
_IMAGE_AUG_TAG = 102
_LM_DATA_TAG = 201
_MLP_DATA_TAG = 301


# ----------------------------------------------------------------------------------------------- image


def synthetic_images(num_samples: int, image_size: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Uint8 ``(N, H, W, 3)`` images and int64 labels: a class colour and grating plus noise, so classes are learnable.

    Built in chunks from per-class float templates so even 20k images at 64 px stay within a second or two
    and a few hundred MB of peak memory.
    """
    rng = np.random.default_rng((seed, _IMAGE_DATA_TAG))
    colours = rng.uniform(50.0, 205.0, (num_classes, 3))
    freq = rng.uniform(1.0, 4.0, num_classes)
    theta = rng.uniform(0.0, math.pi, num_classes)
    phase = rng.uniform(0.0, 2 * math.pi, num_classes)
    channel_mix = rng.uniform(-1.0, 1.0, (num_classes, 3))
    coords = (np.arange(image_size) + 0.5) / image_size
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    proj = xx[None] * np.cos(theta)[:, None, None] + yy[None] * np.sin(theta)[:, None, None]
    wave = np.sin(2 * math.pi * freq[:, None, None] * proj + phase[:, None, None])
    templates = colours[:, None, None, :] + 45.0 * wave[..., None] * channel_mix[:, None, None, :]
    templates = np.rint(templates).astype(np.int16)  # int16 arithmetic below: several times faster than float

    labels = rng.permutation(np.arange(num_samples) % num_classes).astype(np.int64)
    images = np.empty((num_samples, image_size, image_size, 3), dtype=np.uint8)
    chunk = 1024
    for start in range(0, num_samples, chunk):
        lab = labels[start : start + chunk]
        n = len(lab)
        block = rng.integers(-40, 41, (n, image_size, image_size, 3), dtype=np.int16)
        block += templates[lab]
        block += rng.integers(-25, 26, (n, 1, 1, 1), dtype=np.int16)
        np.clip(block, 0, 255, out=block)
        images[start : start + n] = block
    return images, labels


def _luma(img: np.ndarray) -> np.ndarray:
    """Rec. 601 luma of an ``(H, W, 3)`` image, written out so no BLAS thread pool spins up in loader workers."""
    return 0.299 * img[..., 0] + 0.587 * img[..., 1] + 0.114 * img[..., 2]


def _bilinear_crop_resize(
    img: np.ndarray, top: float, left: float, height: float, width: float, out_h: int, out_w: int
) -> np.ndarray:
    """Axis-aligned bilinear crop-and-resize of an ``(H, W, C)`` float image: the core of RandomResizedCrop."""
    rows, cols = img.shape[:2]
    ys = top + (np.arange(out_h, dtype=np.float32) + 0.5) * (height / out_h) - 0.5
    xs = left + (np.arange(out_w, dtype=np.float32) + 0.5) * (width / out_w) - 0.5
    ys = np.clip(ys, 0, rows - 1)
    xs = np.clip(xs, 0, cols - 1)
    y0 = np.floor(ys).astype(np.intp)
    x0 = np.floor(xs).astype(np.intp)
    y1 = np.minimum(y0 + 1, rows - 1)
    x1 = np.minimum(x0 + 1, cols - 1)
    wy = (ys - y0)[:, None, None]
    wx = (xs - x0)[None, :, None]
    interp_rows = img[y0] * (1 - wy) + img[y1] * wy
    return interp_rows[:, x0] * (1 - wx) + interp_rows[:, x1] * wx


def _bilinear_affine(img: np.ndarray, angle: float, shear: float, shift_x: float, shift_y: float) -> np.ndarray:
    """Rotate/shear/translate an ``(H, W, C)`` float image about its centre with bilinear sampling, edges clamped."""
    rows, cols = img.shape[:2]
    cy, cx = (rows - 1) / 2, (cols - 1) / 2
    yy, xx = np.mgrid[0:rows, 0:cols].astype(np.float32)
    yy -= cy
    xx -= cx
    cos, sin = math.cos(angle), math.sin(angle)
    src_x = cos * xx + (sin + shear) * yy + cx + shift_x
    src_y = -sin * xx + cos * yy + cy + shift_y
    x0 = np.floor(src_x).astype(np.intp)
    y0 = np.floor(src_y).astype(np.intp)
    wx = (src_x - x0)[..., None]
    wy = (src_y - y0)[..., None]
    x0c, x1c = np.clip(x0, 0, cols - 1), np.clip(x0 + 1, 0, cols - 1)
    y0c, y1c = np.clip(y0, 0, rows - 1), np.clip(y0 + 1, 0, rows - 1)
    top = img[y0c, x0c] * (1 - wx) + img[y0c, x1c] * wx
    bottom = img[y1c, x0c] * (1 - wx) + img[y1c, x1c] * wx
    return top * (1 - wy) + bottom * wy


def _gaussian_blur(img: np.ndarray, sigma: float, radius: int = 2) -> np.ndarray:
    """Separable Gaussian blur of an ``(H, W, C)`` float image with edge padding (a standard blur augmentation)."""
    taps = np.arange(-radius, radius + 1, dtype=np.float32)
    kernel = np.exp(-0.5 * (taps / sigma) ** 2)
    kernel /= kernel.sum()
    rows, cols = img.shape[:2]
    padded = np.pad(img, ((radius, radius), (radius, radius), (0, 0)), mode="edge")
    vertical = sum(kernel[i] * padded[i : i + rows] for i in range(2 * radius + 1))
    return sum(kernel[i] * vertical[:, i : i + cols] for i in range(2 * radius + 1))


class AugmentedImages(Dataset):
    """Uint8 images augmented per item on the CPU in ``__getitem__``: that cost makes the loader the bottleneck.

    Each item is cropped (random-resized crop of a reflect-padded image), flipped, warped (rotation, shear,
    shift), blurred at ``supersample`` times the output resolution and box-downsampled (antialiasing), colour
    jittered, cut out, normalised per channel and returned CHW. Randomness comes from a generator seeded by
    ``(seed, index)`` alone, so an index always yields the same tensor: the same sample order gives the same
    batches across runs, DataLoader worker counts and item caches.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, seed: int = 0, supersample: int = 3) -> None:
        if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
            raise ValueError(f"images must be a uint8 (N, H, W, 3) array, got {images.dtype} {images.shape}")
        if len(labels) != len(images):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        if supersample < 1:
            raise ValueError(f"supersample must be >= 1, got {supersample}")
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self.seed = int(seed)
        self.supersample = int(supersample)
        sample = images[:1024].reshape(-1, 3).astype(np.float32) / 255.0
        self.mean = sample.mean(axis=0).astype(np.float32)
        self.std = np.maximum(sample.std(axis=0), 1e-3).astype(np.float32)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        return torch.from_numpy(self.augment(index)), torch.tensor(int(self.labels[index]), dtype=torch.int64)

    def augment(self, index: int) -> np.ndarray:
        """The float32 ``(3, H, W)`` augmented image for ``index``: deterministic per (seed, index)."""
        rng = np.random.default_rng((self.seed, _IMAGE_AUG_TAG, index))
        img = self.images[index]
        rows, cols = img.shape[:2]
        ss = self.supersample
        pad = max(1, rows // 8)
        padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)), mode="reflect").astype(np.float32) * (1 / 255)
        prows, pcols = padded.shape[:2]
        area = rows * cols * rng.uniform(0.35, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        height = min(float(prows), math.sqrt(area / ratio))
        width = min(float(pcols), math.sqrt(area * ratio))
        top = rng.uniform(0.0, prows - height)
        left = rng.uniform(0.0, pcols - width)
        x = _bilinear_crop_resize(padded, top, left, height, width, rows * ss, cols * ss)
        if rng.random() < 0.5:
            x = x[:, ::-1]
        x = _bilinear_affine(
            x,
            angle=rng.uniform(-0.26, 0.26),
            shear=rng.uniform(-0.15, 0.15),
            shift_x=rng.uniform(-2.0, 2.0) * ss,
            shift_y=rng.uniform(-2.0, 2.0) * ss,
        )
        x = _gaussian_blur(x, sigma=rng.uniform(0.1, 1.2) * ss)
        x = x.reshape(rows, ss, cols, ss, 3).mean(axis=(1, 3))
        brightness, contrast, saturation = rng.uniform(0.7, 1.3, 3)
        x = x * brightness
        grey_mean = float(_luma(x).mean())
        x = (x - grey_mean) * contrast + grey_mean
        grey = _luma(x)[..., None]
        x = (x - grey) * saturation + grey
        np.clip(x, 0.0, 1.0, out=x)
        cut_h, cut_w = max(1, rows // 4), max(1, cols // 4)
        cy, cx = rng.integers(0, rows - cut_h + 1), rng.integers(0, cols - cut_w + 1)
        x[cy : cy + cut_h, cx : cx + cut_w] = self.mean
        x = (x - self.mean) / self.std
        return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)


def _conv_bn_relu(in_channels: int, out_channels: int, stride: int = 1) -> nn.Sequential:
    """3x3 conv, batch norm, ReLU: the standard CNN unit, bias-free because batch norm supplies the shift."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    """Five conv-bn-relu blocks, global average pool and a linear head: cheap enough that the loader dominates."""

    def __init__(self, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(3, width),
            _conv_bn_relu(width, 2 * width, stride=2),
            _conv_bn_relu(2 * width, 2 * width),
            _conv_bn_relu(2 * width, 4 * width, stride=2),
            _conv_bn_relu(4 * width, 4 * width),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


class BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convs plus identity or 1x1 projection shortcut), as in He et al. 2016."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet for small images: a 3x3 stride-1 stem and no max-pool, so 32-64 px inputs keep spatial detail."""

    def __init__(
        self, blocks_per_stage: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 100, width: int = 64
    ) -> None:
        super().__init__()
        self.stem = _conv_bn_relu(3, width)
        stages: list[nn.Module] = []
        in_channels = width
        for i, count in enumerate(blocks_per_stage):
            out_channels = width * 2**i
            for j in range(count):
                stages.append(BasicBlock(in_channels, out_channels, stride=2 if (i > 0 and j == 0) else 1))
                in_channels = out_channels
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


def resnet18(num_classes: int = 100) -> ResNet:
    """ResNet-18 (2-2-2-2 basic blocks, ~11M parameters): the canonical mid-size vision benchmark model."""
    return ResNet((2, 2, 2, 2), num_classes=num_classes)


# ----------------------------------------------------------------------------------------------- language model


def markov_tokens(
    num_tokens: int, vocab_size: int, seed: int, branching: int = 4, chain_len: int = 2048
) -> torch.Tensor:
    """A 1-D int64 token stream from a sparse first-order Markov chain: learnable, generated without per-token Python.

    Each token has ``branching`` successors with skewed probabilities, plus a 5% uniform jump (entropy
    about 1.5 nats against ``log(vocab)`` for a uniform guess). Many independent chains of ``chain_len``
    tokens step in parallel and are laid end to end, so the Python loop runs ``chain_len`` times whatever
    ``num_tokens`` is.
    """
    rng = np.random.default_rng((seed, _LM_DATA_TAG))
    successors = rng.integers(0, vocab_size, (vocab_size, branching))
    probs = 0.5 ** np.arange(branching)
    cdf = np.cumsum(probs / probs.sum())
    cdf[-1] = 1.0
    num_chains = max(1, -(-num_tokens // chain_len))
    steps = -(-num_tokens // num_chains)
    choice = np.searchsorted(cdf, rng.random((steps, num_chains)), side="right").astype(np.intp)
    jump = rng.random((steps, num_chains)) < 0.05
    random_tokens = rng.integers(0, vocab_size, (steps, num_chains))
    states = np.empty((steps, num_chains), dtype=np.int64)
    current = rng.integers(0, vocab_size, num_chains)
    for t in range(steps):
        states[t] = current
        current = np.where(jump[t], random_tokens[t], successors[current, choice[t]])
    return torch.from_numpy(np.ascontiguousarray(states.T).reshape(-1)[:num_tokens])


class TokenWindows(Dataset):
    """Fixed-length (input, next-token target) windows over one token tensor: the standard causal-LM data layout."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, stride: int | None = None) -> None:
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
        self.tokens = tokens.to(torch.int64)
        self.seq_len = int(seq_len)
        self.stride = int(stride if stride is not None else seq_len)
        if self.seq_len < 1 or self.stride < 1:
            raise ValueError(f"seq_len and stride must be >= 1, got {self.seq_len} and {self.stride}")

    def __len__(self) -> int:
        return max(0, (self.tokens.numel() - self.seq_len - 1) // self.stride + 1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        start = index * self.stride
        chunk = self.tokens[start : start + self.seq_len + 1]
        # Clones, so an item never pins (or ships) the whole token stream's storage.
        return chunk[:-1].clone(), chunk[1:].clone()


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention through ``scaled_dot_product_attention``, so fused/flash kernels apply on GPU."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model {d_model} is not divisible by n_head {n_head}")
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, dim // self.n_head).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, dim))


class Block(nn.Module):
    """Pre-norm transformer block (LayerNorm before attention and MLP), the GPT-2 layout that trains stably."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU(approximate="tanh")
        self.fc_out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc_out(self.act(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """GPT-2-style decoder (learned positions, pre-norm blocks, tied LM head) returning logits ``[B, T, V]``.

    Weights use GPT-2's N(0, 0.02) init with residual projections scaled by ``1/sqrt(2 * n_layer)``: with
    PyTorch's default N(0, 1) embedding init the tied head would start with huge logits.
    """

    def __init__(self, vocab_size: int, seq_len: int, n_layer: int, d_model: int, n_head: int) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(_gpt_init)
        for block in self.blocks:
            for proj in (block.attn.proj, block.fc_out):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq = idx.shape[1]
        if seq > self.seq_len:
            raise ValueError(f"sequence length {seq} exceeds the model's {self.seq_len}")
        pos = torch.arange(seq, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _gpt_init(module: nn.Module) -> None:
    """GPT-2 initialisation for linear and embedding layers (LayerNorm keeps PyTorch's ones/zeros)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy over flattened ``[B*T, V]`` logits: ``cross_entropy`` wants classes in dim 1."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ----------------------------------------------------------------------------------------------- tabular MLP


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


# ----------------------------------------------------------------------------------------------- entry point


def _image_workload(size: str, num_samples: int | None, seed: int) -> Workload:
    """The data-bound demo: heavy per-item augmentation feeding a small CNN (small) or ResNet-18 at 64 px (gpu)."""
    if size == "small":
        image_size, num_classes, n, batch, supersample = 32, 10, 2048, 64, 3
        model: Callable[[], nn.Module] = functools.partial(SmallCNN, num_classes=num_classes)
    else:
        image_size, num_classes, n, batch, supersample = 64, 100, 20000, 128, 2
        model = functools.partial(resnet18, num_classes=num_classes)
    n = num_samples if num_samples is not None else n
    images, labels = synthetic_images(n, image_size, num_classes, seed)
    dataset = AugmentedImages(images, labels, seed=seed, supersample=supersample)
    return Workload(
        model=model,
        dataset=dataset,
        loss_fn=F.cross_entropy,
        name=f"image-{size}",
        batch_size=batch,
        seed=seed,
        metadata={
            "demo": "image",
            "size": size,
            "image_size": image_size,
            "num_classes": num_classes,
            "supersample": supersample,
            "bound": "data",
        },
    )


def _lm_workload(size: str, num_samples: int | None, seed: int) -> Workload:
    """Causal LM over Markov tokens: a 2-layer toy (small) or GPT-2 small, 124M parameters (gpu)."""
    if size == "small":
        cfg: dict[str, int] = {"vocab_size": 256, "seq_len": 64, "n_layer": 2, "d_model": 128, "n_head": 4}
        n, batch = 2048, 32
    else:
        cfg = {"vocab_size": 50304, "seq_len": 1024, "n_layer": 12, "d_model": 768, "n_head": 12}
        n, batch = 4096, 16
    n = num_samples if num_samples is not None else n
    seq = cfg["seq_len"]
    tokens = markov_tokens(n * seq + 1, cfg["vocab_size"], seed)
    return Workload(
        model=functools.partial(TinyGPT, **cfg),
        dataset=TokenWindows(tokens, seq),
        loss_fn=lm_loss,
        name=f"lm-{size}",
        tokens_per_sample=seq,
        batch_size=batch,
        seed=seed,
        metadata={"demo": "lm", "size": size, **cfg},
    )


def _mlp_workload(size: str, num_samples: int | None, seed: int) -> Workload:
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


_BUILDERS: dict[str, Callable[[str, int | None, int], Workload]] = {
    "image": _image_workload,
    "lm": _lm_workload,
    "mlp": _mlp_workload,
}


def demo_workload(name: str, size: DemoSize = "small", *, num_samples: int | None = None, seed: int = 0) -> Workload:
    """A ready-made :class:`Workload` by name (``DEMO_NAMES``) and size (``DEMO_SIZES``), fully determined by ``seed``.

    ``num_samples`` overrides the dataset length (images, token windows or rows), e.g. to keep a ``"gpu"``
    dataset tiny in tests.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown demo {name!r}; valid names: {', '.join(DEMO_NAMES)}")
    if size not in DEMO_SIZES:
        raise ValueError(f"unknown size {size!r}; valid sizes: {', '.join(DEMO_SIZES)}")
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)):
        raise TypeError(f"num_samples must be an int or None, got {num_samples!r}")
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    return _BUILDERS[name](size, num_samples, int(seed))
