"""The data-bound image demo: synthetic images with heavy per-item augmentation on the CPU, feeding a small CNN
(small) or ResNet-18 at 64 px (gpu)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from ..inputs.workload import Workload

# Distinct SeedSequence tags keep each generator's stream independent of the others and of the per-item ones.
_IMAGE_DATA_TAG = 101


_IMAGE_AUG_TAG = 102


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


def image_workload(size: str, num_samples: int | None, seed: int) -> Workload:
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
