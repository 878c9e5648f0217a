"""The language-model demo: a causal transformer over Markov-chain tokens, a 2-layer toy (small) or GPT-2 small
with 124M parameters (gpu)."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from ..inputs.workload import Workload

_LM_DATA_TAG = 201


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


def lm_workload(size: str, num_samples: int | None, seed: int) -> Workload:
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
