"""Tests for the demo workloads: shapes, determinism, real augmentation cost, learnability, picklability."""

from __future__ import annotations

import pickle
import time

import cloudpickle
import pytest
import torch
from torch.utils.data import DataLoader

from accel_widgets.demos import (
    DEMO_NAMES,
    DEMO_SIZES,
    AugmentedImages,
    TinyGPT,
    TokenWindows,
    demo_workload,
)
from accel_widgets.inputs.workload import Workload

SMALL_N = 64  # enough for a batch of 8 and a few tiny training steps, fast to build


def _batch(workload: Workload, n: int = 8, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    items = [workload.dataset[i] for i in range(start, start + n)]
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_demo_names_constant() -> None:
    assert DEMO_NAMES == ("image", "lm", "mlp")
    assert DEMO_SIZES == ("small", "gpu")


@pytest.mark.parametrize(
    ("name", "x_shape", "x_dtype", "y_shape", "y_dtype"),
    [
        ("image", (3, 32, 32), torch.float32, (), torch.int64),
        ("lm", (64,), torch.int64, (64,), torch.int64),
        ("mlp", (64,), torch.float32, (1,), torch.float32),
    ],
)
def test_small_demo_item_batch_and_backward(name, x_shape, x_dtype, y_shape, y_dtype) -> None:
    w = demo_workload(name)
    assert isinstance(w, Workload)
    assert w.name == f"{name}-small"
    assert w.batch_size and w.batch_size > 0
    assert len(w.dataset) > 0
    x, y = w.dataset[0]
    assert tuple(x.shape) == x_shape and x.dtype == x_dtype
    assert tuple(y.shape) == y_shape and y.dtype == y_dtype

    model = w.build_model()
    xb, yb = _batch(w)
    loss = w.loss_fn(model(xb), yb)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_lm_workload_fields() -> None:
    w = demo_workload("lm", num_samples=SMALL_N)
    assert w.tokens_per_sample == 64
    assert isinstance(w.dataset, TokenWindows)
    assert len(w.dataset) == SMALL_N
    x, y = w.dataset[3]
    assert torch.equal(x[1:], y[:-1])  # targets are the inputs shifted by one
    logits = w.build_model()(x[None])
    assert logits.shape == (1, 64, 256)
    with pytest.raises(IndexError):
        w.dataset[SMALL_N]


@pytest.mark.parametrize("name", DEMO_NAMES)
def test_same_seed_same_items_and_weights(name) -> None:
    a = demo_workload(name, num_samples=SMALL_N, seed=3)
    b = demo_workload(name, num_samples=SMALL_N, seed=3)
    c = demo_workload(name, num_samples=SMALL_N, seed=4)
    for i in (0, 5, SMALL_N - 1):
        for ta, tb in zip(a.dataset[i], b.dataset[i], strict=True):
            assert torch.equal(ta, tb)
    assert any(not torch.equal(a.dataset[i][0], c.dataset[i][0]) for i in range(4))

    sa, sb, sc = _state(a.build_model()), _state(b.build_model()), _state(c.build_model())
    assert sa.keys() == sb.keys() == sc.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())


def test_image_augmentation_deterministic_random_and_costly() -> None:
    w = demo_workload("image", num_samples=SMALL_N)
    ds = w.dataset
    assert isinstance(ds, AugmentedImages)
    # Deterministic per index, whatever else was drawn in between and in whatever order.
    first = ds[7][0]
    _ = [ds[i] for i in reversed(range(SMALL_N))]
    assert torch.equal(ds[7][0], first)
    assert torch.equal(ds[-1][0], ds[SMALL_N - 1][0])
    # Augmentation really changes the image: two datasets over the same pixels with different aug seeds differ.
    other = AugmentedImages(ds.images, ds.labels, seed=ds.seed + 1, supersample=ds.supersample)
    assert not torch.equal(other[7][0], first)
    # Roughly normalised output.
    stack = torch.stack([ds[i][0] for i in range(32)])
    assert torch.isfinite(stack).all()
    assert abs(stack.mean().item()) < 1.0 and 0.2 < stack.std().item() < 3.0
    # Real CPU work per item (a loose lower bound, not a speed claim).
    n = 40
    start = time.perf_counter()
    for i in range(n):
        ds[i % SMALL_N]
    assert (time.perf_counter() - start) / n > 0.3e-3


def test_image_items_same_across_loader_worker_counts() -> None:
    w = demo_workload("image", num_samples=16)
    serial = [b for b in DataLoader(w.dataset, batch_size=8, num_workers=0)]
    parallel = [b for b in DataLoader(w.dataset, batch_size=8, num_workers=2)]
    for (xa, ya), (xb, yb) in zip(serial, parallel, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize(("name", "batch"), [("mlp", 64), ("lm", 16)])
def test_small_demo_is_learnable(name, batch) -> None:
    w = demo_workload(name, num_samples=512)
    model = w.build_model()
    opt = w.optimizer(model.parameters())
    loader = DataLoader(w.dataset, batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(0))
    losses: list[float] = []
    while len(losses) < 30:
        for x, y in loader:
            loss = w.loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if len(losses) == 30:
                break
    head, tail = sum(losses[:3]) / 3, sum(losses[-5:]) / 5
    assert tail < 0.8 * head, (head, tail)


def test_gpu_models_parameter_counts() -> None:
    lm = demo_workload("lm", "gpu", num_samples=1)
    image = demo_workload("image", "gpu", num_samples=4)
    mlp = demo_workload("mlp", "gpu", num_samples=4)
    gpt = lm.build_model()
    assert isinstance(gpt, TinyGPT)
    assert abs(_param_count(gpt) - 124e6) <= 12.4e6
    assert gpt.head.weight is gpt.tok_emb.weight  # tied head
    assert 10.5e6 <= _param_count(image.build_model()) <= 12e6  # ResNet-18
    assert _param_count(mlp.build_model()) > 10e6
    assert lm.tokens_per_sample == 1024 and lm.batch_size == 16


def test_gpu_datasets_shapes_when_tiny() -> None:
    x, y = demo_workload("image", "gpu", num_samples=4).dataset[0]
    assert x.shape == (3, 64, 64) and x.dtype == torch.float32 and 0 <= int(y) < 100
    x, y = demo_workload("lm", "gpu", num_samples=2).dataset[1]
    assert x.shape == y.shape == (1024,) and int(x.max()) < 50304
    x, y = demo_workload("mlp", "gpu", num_samples=4).dataset[0]
    assert x.dtype == torch.float32 and y.shape == (1,)


def test_unknown_name_or_size_names_valid_values() -> None:
    with pytest.raises(ValueError, match=r"image.*lm.*mlp"):
        demo_workload("resnet")
    with pytest.raises(ValueError, match=r"small.*gpu"):
        demo_workload("mlp", "huge")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        demo_workload("mlp", num_samples=0)


@pytest.mark.parametrize("name", DEMO_NAMES)
@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_workload_pickles_by_reference(name, dumps) -> None:
    w = demo_workload(name, num_samples=16, seed=2)
    blob = dumps(w)
    assert b"accel_widgets.demos" in blob
    # By reference: cloudpickle rebuilds classes/functions by value through these helpers; none may appear.
    assert b"_make_skeleton_class" not in blob and b"_make_function" not in blob
    copy = pickle.loads(blob)
    assert copy.name == w.name and copy.seed == w.seed and len(copy.dataset) == len(w.dataset)
    for ta, tb in zip(copy.dataset[5], w.dataset[5], strict=True):
        assert torch.equal(ta, tb)
    sa, sb = _state(copy.build_model()), _state(w.build_model())
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
