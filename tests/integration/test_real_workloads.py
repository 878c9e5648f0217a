"""Workloads as people already have them: Hugging Face dict batches that carry their own loss, an
existing DataLoader with its own sampler, a custom step, gradient clipping. Real models nobody here wrote
(transformers' BERT, built from a config with random weights), small synthetic data, CPU only."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

from accel_widgets import BurstOptions, BurstResult, Config, WorkerError, Workload, run_burst
from accel_widgets.knobs import CodePaths
from accel_widgets.knobs.data import RankShard, loader_notes
from accel_widgets.views.text import summary
from tests.devices import cpu_device
from tests.workloads import TinyNet, conv_workload, tensors, tiny_workload

transformers = pytest.importorskip("transformers")

SEQ, REAL_TOKENS, VOCAB = 16, 10, 500


class TokenItems(Dataset):
    """Hugging Face style items: input_ids, attention_mask (10 real tokens of 16) and labels."""

    def __init__(self, n: int = 256) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (n, SEQ), generator=generator)
        self.labels = (self.ids[:, 0] % 3).long()
        self.mask = torch.zeros(SEQ, dtype=torch.long)
        self.mask[:REAL_TOKENS] = 1

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index] * self.mask, "attention_mask": self.mask, "labels": self.labels[index]}


def tiny_bert(**options: str) -> nn.Module:
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=SEQ, num_labels=3, **options)
    return transformers.BertForSequenceClassification(config)


def bert_workload(model=tiny_bert, **changes) -> Workload:
    return Workload(model=model, dataset=TokenItems(), batch_size=16, name="tiny-bert",
                    optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3), **changes)


@pytest.mark.slow
def test_a_hugging_face_model_trains_on_dict_batches_with_its_own_loss_and_real_tokens():
    result = run_burst(bert_workload(), Config(), steps=6, options=BurstOptions(device=cpu_device()))
    assert result.ok, summary(result)
    losses = result.losses()
    assert all(torch.isfinite(torch.tensor(losses)))
    assert result.ranks[0].measured_tokens == 6 * 16 * REAL_TOKENS  # padding is not counted
    assert result.tokens_per_s == pytest.approx(result.samples_per_s * REAL_TOKENS)


def test_dict_batches_train_under_ddp_too():
    result = run_burst(bert_workload(), Config(parallel="ddp", world_size=2), steps=3,
                       options=BurstOptions(device=cpu_device()))
    assert result.ok and len(result.measured_steps(rank=1)) == 3


def test_a_loss_fn_sees_the_output_and_the_whole_batch():
    workload = bert_workload(loss_fn=lambda output, batch: F.cross_entropy(output.logits, batch["labels"]))
    reference = run_burst(bert_workload(), Config(), steps=3,
                          options=BurstOptions(isolation="inprocess", device=cpu_device()))
    result = run_burst(workload, Config(), steps=3, options=BurstOptions(isolation="inprocess", device=cpu_device()))
    assert result.losses() == pytest.approx(reference.losses())  # the same loss BERT computes itself


def test_items_the_loop_cannot_use_fail_when_the_workload_is_made_saying_what_to_write():
    no_labels = [{"input_ids": torch.zeros(4, dtype=torch.long)}] * 8
    with pytest.raises(TypeError, match="Add 'labels' to each item, or pass loss_fn="):
        Workload(model=tiny_bert, dataset=no_labels)
    with pytest.raises(TypeError, match="pairs and there is no loss_fn"):
        Workload(model=TinyNet, dataset=tensors())
    class Bare(Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.zeros(16)

    with pytest.raises(TypeError, match=r"dataset\[0\] is a Tensor: each item must be an \(input, target\) pair"):
        Workload(model=TinyNet, dataset=Bare(), loss_fn=F.cross_entropy)


def test_a_model_without_a_loss_is_named_in_the_worker():
    class NoLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 4)

        def forward(self, input_ids, attention_mask, labels):
            return self.embed(input_ids).mean()

    with pytest.raises(WorkerError, match="returned a Tensor without a loss"):
        run_burst(bert_workload(model=NoLoss), Config(), steps=2, options=BurstOptions(device=cpu_device()))


class CountingItems(Dataset):
    """(x, y) pairs that count how often each index was read (in-process bursts share the dataset)."""

    def __init__(self) -> None:
        self.x, self.y = tensors(256)
        self.reads: Counter[int] = Counter()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads[index] += 1
        return self.x[index], self.y[index]


def test_an_existing_dataloader_keeps_its_sampler_and_says_what_the_knobs_replaced():
    items = CountingItems()
    weights = torch.tensor([1.0 if i < 64 else 0.0 for i in range(256)])  # only the first 64 items
    sampler = WeightedRandomSampler(weights, num_samples=256, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(items, batch_size=16, sampler=sampler, num_workers=2, pin_memory=True)
    workload = Workload(model=TinyNet, dataset=loader, loss_fn=F.cross_entropy)
    assert workload.loader is loader and workload.dataset is items and workload.batch_size == 16
    items.reads.clear()  # the workload read item 0 to check its shape
    result = run_burst(workload, Config(), steps=8, options=BurstOptions(isolation="inprocess", device=cpu_device()))
    assert result.ok
    items.reads.subtract({0: 3, 128: 3})  # items 0 and n/2 read thrice (twice under one key): random? keyed?
    assert sum(items.reads.values()) == 10 * 16 and max(+items.reads) < 64  # the user's sampler chose them
    (note,) = [w for w in result.warnings if "your DataLoader" in w]
    assert "num_workers=2, pin_memory=True replaced by the knobs" in note


def test_a_users_sampler_is_split_across_ddp_ranks_and_a_batch_sampler_is_refused():
    sampler = WeightedRandomSampler(torch.ones(100), num_samples=100, generator=torch.Generator().manual_seed(0))
    # Each rank unpickles its own copy, with the same generator state: the same order, split by position.
    shards = [list(RankShard(copy.deepcopy(sampler), rank, 2)) for rank in (0, 1)]
    order = list(copy.deepcopy(sampler))
    assert len(shards[0]) == len(shards[1]) == 50
    assert shards[0] == order[0::2] and shards[1] == order[1::2]
    batches = DataLoader(tensors()[0], batch_sampler=[[0, 1], [2, 3]])
    workload = Workload(model=TinyNet, dataset=batches, loss_fn=F.cross_entropy, step=lambda m, b: m(b).sum())
    with pytest.raises(ValueError, match="cannot be split across DDP ranks"):
        loader_notes(workload, Config(parallel="ddp", world_size=2))
    with pytest.raises(ValueError, match="cannot be split across DDP ranks"):
        run_burst(workload, Config(parallel="ddp", world_size=2), steps=2, options=BurstOptions(device=cpu_device()))


class NormRecorder(torch.optim.SGD):
    """SGD that records the total gradient norm it is asked to apply."""

    def __init__(self, params, **kwargs) -> None:
        super().__init__(params, **kwargs)
        self.norms: list[float] = []

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
        return super().step(closure)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_clipping_sees_unscaled_gradients(precision):
    """Under fp16 the gradients carry the loss scale (65536 at first): clipping them unscaled is the only way
    the optimizer receives a norm of max_grad_norm rather than 1/65536 of it."""
    recorded: list[NormRecorder] = []

    def optimizer(params):
        recorded.append(NormRecorder(params, lr=0.01))
        return recorded[-1]

    workload = Workload(model=TinyNet, dataset=tensors(), batch_size=32, optimizer=optimizer, max_grad_norm=0.01,
                        step=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]))
    result = run_burst(workload, Config(precision=precision), steps=4,
                       options=BurstOptions(isolation="inprocess", device=cpu_device()))
    assert result.ok
    norms = recorded[-1].norms  # the raw gradient norm is ~0.5: every step is clipped
    assert len(norms) >= 4 and all(0.0099 < n <= 0.01 + 1e-6 for n in norms), norms  # never 0.01 / scale


def test_clipping_works_with_a_fused_optimizer_under_ddp():
    workload = Workload(model=TinyNet, dataset=tensors(), loss_fn=F.cross_entropy, batch_size=32, max_grad_norm=1.0)
    result = run_burst(workload, Config(parallel="ddp", world_size=2, optimizer_impl="fused"), steps=3,
                       options=BurstOptions(device=cpu_device()))
    assert result.ok and result.losses()[-1] < result.losses()[0]


# -- which code paths the step ran ---------------------------------------------------------------------
@pytest.mark.parametrize(("name", "workload", "paths"), [
    ("mlp", lambda: tiny_workload(), CodePaths(sdpa=False, convolution=False, cuda=False)),
    ("cnn", lambda: conv_workload(), CodePaths(sdpa=False, convolution=True, cuda=False)),
    ("bert", lambda: bert_workload(model=lambda: tiny_bert(attn_implementation="sdpa")),
     CodePaths(sdpa=True, convolution=False, cuda=False)),
    ("bert eager", lambda: bert_workload(model=lambda: tiny_bert(attn_implementation="eager")),
     CodePaths(sdpa=False, convolution=False, cuda=False)),
], ids=lambda value: value if isinstance(value, str) else "")
def test_a_burst_records_the_code_paths_its_step_ran(name, workload, paths):
    result = run_burst(workload(), Config(), steps=2, options=BurstOptions(device=cpu_device()))
    assert result.ok, summary(result)
    assert result.code_paths == paths
    assert BurstResult.from_json(result.to_json()).code_paths == paths
