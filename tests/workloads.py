"""Tiny workloads for engine tests, including ones that fail in each way a real workload can."""

from __future__ import annotations

import functools
import os
import random
import signal
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from accel_widgets import Workload

FEATURES, CLASSES = 16, 4


class TinyNet(nn.Module):
    """Two linear layers: fast enough that a burst's cost is the harness, not the model."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(FEATURES, 32)
        self.out = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.hidden(x)))


class TinyConvNet(nn.Module):
    """A conv + batch-norm model, for channels_last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.norm(self.conv(x))).mean(dim=(2, 3)))


class FailAt(TinyNet):
    """Fails on the k-th forward call in the way named by ``how`` (on one DDP rank, if ``rank`` is set)."""

    def __init__(self, how: str, at_call: int = 3, rank: int | None = None) -> None:
        super().__init__()
        self.how, self.at_call, self.calls, self.rank = how, at_call, 0, rank

    def _my_turn(self) -> bool:
        if self.rank is None:
            return True
        import torch.distributed as dist

        return dist.is_initialized() and dist.get_rank() == self.rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.at_call and self._my_turn():
            if self.how == "raise":
                raise ValueError(f"deliberate failure at call {self.calls}")
            if self.how == "oom":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == "hang":
                time.sleep(3600)
            if self.how == "hang-ignoring-sigterm":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                time.sleep(3600)
            if self.how == "sys.exit(0)":
                sys.exit(0)
            if self.how == "sys.exit(3)":
                sys.exit(3)
            if self.how == "os._exit(0)":
                os._exit(0)
            if self.how == "os._exit(3)":
                os._exit(3)
            if self.how == "KeyboardInterrupt":
                raise KeyboardInterrupt
        return super().forward(x)


class ForksInForward(TinyNet):
    """At its first forward, starts processes that would outlive the step: a plain fork that sleeps, and a daemon
    (a double fork into its own session, the middle process exiting at once) that sleeps too. The pids go to
    ``pid_file``, one per line, written by their parents, so the test knows them however fast the rank ends.
    With ``then_raise`` the forward raises once they exist."""

    def __init__(self, pid_file: str, then_raise: bool = False) -> None:
        super().__init__()
        self.pid_file, self.then_raise, self.forked = pid_file, then_raise, False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.forked:
            self.forked = True
            self._start(daemon=False)
            self._start(daemon=True)
            if self.then_raise:
                raise RuntimeError("forked, then failed")
        return super().forward(x)

    def _start(self, daemon: bool) -> None:
        pid = os.fork()
        if pid == 0:  # the child: only system calls from here on, then it leaves without Python's teardown
            if daemon:
                os.setsid()
                grandchild = os.fork()
                if grandchild:
                    self._note(grandchild)
                    os._exit(0)
            time.sleep(3600)
            os._exit(0)
        if daemon:
            os.waitpid(pid, 0)  # the double fork's parent reaps the middle process, which noted the daemon first
        else:
            self._note(pid)

    def _note(self, pid: int) -> None:
        with open(self.pid_file, "a") as file:
            file.write(f"{pid}\n")


class DivergesAt(TinyNet):
    """Its output turns NaN at the k-th forward call, as an overflow would; the NaN gradients that follow keep
    every later loss NaN, the way a real divergence does."""

    def __init__(self, at_call: int = 4) -> None:
        super().__init__()
        self.at_call, self.calls = at_call, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = super().forward(x)
        return out * float("nan") if self.calls == self.at_call else out


def tensors(n: int = 512, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=generator)
    y = (x[:, :CLASSES].argmax(dim=1)).long()
    return x, y


class SlowToExit(TinyNet):
    """Starts a non-daemon thread that runs a minute longer: the rank delivers its result, then cannot exit
    (as when persistent loader workers, a compile pool or a CUDA context take long to close)."""

    def __init__(self) -> None:
        super().__init__()
        threading.Thread(target=time.sleep, args=(60.0,), name="slow-to-exit", daemon=False).start()


class FailsWhileProfiled(TinyNet):
    """Raises in forward while torch.profiler records, as an out-of-memory in a profiled step would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.autograd._profiler_enabled():
            raise torch.OutOfMemoryError("CUDA out of memory while profiling (the profiler's buffers)")
        return super().forward(x)


class _UnstartableProfiler:
    """torch.profiler.profile on a machine whose CUPTI cannot start."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __enter__(self) -> None:
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED: cupti initialization failed")

    def __exit__(self, *exc: object) -> None:
        pass


class BreaksTheProfiler(TinyNet):
    """Built in its rank, it leaves that process a profiler that cannot start (the test's own is untouched)."""

    def __init__(self) -> None:
        super().__init__()
        torch.profiler.profile = _UnstartableProfiler


def tiny_workload(model: nn.Module | None = None, **kwargs) -> Workload:
    """A TinyNet factory by default: the engine seeds it, so every burst starts from the same weights."""
    return Workload(model=model or TinyNet, dataset=tensors(), loss_fn=F.cross_entropy, batch_size=32,
                    name="tiny", **kwargs)


def fast_learning_workload(**kwargs) -> Workload:
    """:func:`tiny_workload` at a learning rate of 1e-2, where its loss falls within ten steps: at AdamW's default
    1e-3 the tiny task needs ~30, and a shorter burst's fall depends on which batches came first."""
    return tiny_workload(optimizer=functools.partial(torch.optim.AdamW, lr=1e-2), **kwargs)


def loss_fell(losses: list[float]) -> bool:
    """The last three losses' mean below the first three's (one batch's loss is noisy)."""
    return sum(losses[-3:]) < sum(losses[:3])


def conv_data() -> tuple[torch.Tensor, torch.Tensor]:
    """256 small RGB images and their labels."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(256, 3, 8, 8, generator=generator), torch.randint(0, CLASSES, (256,), generator=generator)


def conv_workload() -> Workload:
    return Workload(model=TinyConvNet(), dataset=conv_data(), loss_fn=F.cross_entropy, batch_size=16,
                    name="tiny-conv")


class LockedDataset(torch.utils.data.Dataset):
    """Holds a thread lock: cannot travel to another process."""

    def __init__(self) -> None:
        self.x, self.y = tensors()
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with self.lock:
            return self.x[index], self.y[index]


class StuckItemDataset(torch.utils.data.Dataset):
    """Every item after the first ``stuck_after`` a loader worker serves hangs: a loader worker that never returns."""

    def __init__(self, stuck_after: int = 64) -> None:
        self.x, self.y = tensors()
        self.stuck_after, self.served = stuck_after, 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.served += 1
        if self.served > self.stuck_after:
            time.sleep(3600)
        return self.x[index], self.y[index]


def net_with_broken_compiler() -> nn.Module:
    """Builds TinyNet in the worker after pointing inductor at a C++ compiler that does not exist.

    This is a real inductor failure (the notes saw it on machines without g++), raised at the first
    compiled call, not a simulated exception.
    """
    import torch._inductor.config as inductor_config

    inductor_config.cpp.cxx = ("/nonexistent/c++",)
    return TinyNet()


def exported_workload() -> Workload:
    """``tests.workloads:exported_workload``: the module:function form export_script needs."""
    return tiny_workload()


def batch_sampler_workload() -> Workload:
    """A user's DataLoader with a batch sampler: its batches are fixed, so no DDP rank can take a share of them."""
    loader = torch.utils.data.DataLoader(tensors()[0], batch_sampler=[[0, 1], [2, 3]])
    return Workload(model=TinyNet, dataset=loader, step=lambda model, batch: model(batch).sum())


class KnobsActed(TinyConvNet):
    """A conv net that fails its forward unless the knobs it is told of act in its rank: the inputs arrive in
    channels_last, autocast runs in bf16, the algorithms are deterministic, and (from the second step) the
    gradients were zeroed in place rather than dropped."""

    def __init__(self, expect: frozenset[str]) -> None:
        super().__init__()
        self.expect, self.calls = expect, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        checks = {
            "channels_last": x.is_contiguous(memory_format=torch.channels_last),
            "bf16": torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "zeroed": self.calls == 1 or all(p.grad is not None for p in self.parameters()),
        }
        missed = [what for what in self.expect if not checks[what]]
        if missed:
            raise AssertionError(f"knobs that did not act in this rank: {missed}")
        return super().forward(x)


class ReadersRecorded(torch.utils.data.Dataset):
    """Images that leave a file named after each process that reads one in ``directory``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        open(os.path.join(self.directory, str(os.getpid())), "a").close()
        generator = torch.Generator().manual_seed(index)
        return torch.randn(3, 8, 8, generator=generator), index % CLASSES


class ForeachSGD(torch.optim.SGD):
    """SGD that fails its step unless it was built with the multi-tensor (foreach) implementation."""

    def step(self, closure=None):
        if not all(group["foreach"] for group in self.param_groups):
            raise AssertionError("the optimizer was not rebuilt with foreach=True")
        return super().step(closure)


def scripted_only(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy that fails unless TorchScript compiled it (script_loss=True)."""
    if not torch.jit.is_scripting():
        raise AssertionError("the loss ran as Python, not TorchScript")
    return F.cross_entropy(output, target)


class SignalsItself(TinyNet):
    """Sends its own process ``signum`` at its ``at_call``-th training forward, on rank 0 only: a preemption
    (SIGTERM) or a crash (SIGKILL) at a known step of a job."""

    def __init__(self, signum: signal.Signals, at_call: int) -> None:
        super().__init__()
        self.signum, self.at_call, self.calls = signum, at_call, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == self.at_call and int(os.environ.get("RANK", 0)) == 0:
                os.kill(os.getpid(), self.signum)
        return super().forward(x)


def armed_model() -> nn.Module:
    """TinyNet, or under ``AW_TEST_SIGNAL=SIGKILL@13`` one that makes rank 0 send itself that signal at the 13th
    training forward of its process (same weights: the subclass builds the same layers from the same seed)."""
    armed = os.environ.get("AW_TEST_SIGNAL")
    if not armed:
        return TinyNet()
    name, at_call = armed.split("@")
    return SignalsItself(signal.Signals[name], int(at_call))


def job_workload() -> Workload:
    """``tests.workloads:job_workload``: TinyNet (:func:`armed_model`) with an LR schedule and an evaluation set."""
    return Workload(model=armed_model, dataset=tensors(), loss_fn=F.cross_entropy, batch_size=32, name="job",
                    scheduler=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5),
                    eval_dataset=tensors(96, seed=1))


class AugmentedItems(torch.utils.data.Dataset):
    """The tiny task, each read augmented from torch's, Python's and NumPy's generators: noise from torch and NumPy,
    and half the time (Python's ``random``) the features that do not decide the label reversed."""

    def __init__(self, n: int = 96) -> None:
        self.x, self.y = tensors(n)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[index] + 0.3 * torch.randn(FEATURES) + 0.1 * float(np.random.standard_normal())
        if random.random() < 0.5:
            x = torch.cat([x[:CLASSES], x[CLASSES:].flip(0)])
        return x, self.y[index]


def augmented_job_workload() -> Workload:
    """``tests.workloads:augmented_job_workload``: :func:`armed_model` on 96 randomly augmented items in batches of
    16 (6 batches an epoch, 3 per rank under DDP x 2), with an LR schedule and an evaluation set."""
    return Workload(model=armed_model, dataset=AugmentedItems(), loss_fn=F.cross_entropy, batch_size=16,
                    name="augmented job",
                    scheduler=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5),
                    eval_dataset=tensors(96, seed=1))


def gpt_workload(*, n_layer: int = 8, d_model: int = 16, seq_len: int = 64, batch_size: int = 128) -> Workload:
    """A small causal transformer (the LM demo's TinyGPT: blocks of attention and MLP in an nn.ModuleList) whose
    activations outweigh its weights many times over: thin (``d_model``), many tokens per step."""
    from accel_widgets.demos.lm import TinyGPT, TokenWindows, lm_loss, markov_tokens

    model = functools.partial(TinyGPT, vocab_size=256, seq_len=seq_len, n_layer=n_layer, d_model=d_model, n_head=2)
    tokens = markov_tokens(4 * batch_size * seq_len + 1, 256, seed=0)
    return Workload(model=model, dataset=TokenWindows(tokens, seq_len), loss_fn=lm_loss, batch_size=batch_size,
                    name="tiny-gpt")


class WideBlocks(nn.Module):
    """Blocks of wide MLPs (``width`` -> 4 x ``width`` -> ``width``) in an nn.ModuleList: weights and their AdamW
    state outweigh the activations of a few rows, as in the models FSDP is for."""

    def __init__(self, width: int = 512, blocks: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                    for _ in range(blocks))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def wide_workload(width: int = 512) -> Workload:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, width, generator=generator)
    return Workload(model=functools.partial(WideBlocks, width), dataset=(x, x[:, :CLASSES].argmax(dim=1)),
                    loss_fn=F.cross_entropy, optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4),
                    batch_size=8, name="wide")
# -- what torch.compile meets: alike blocks, a graph break, a new shape every step -------------------------------
# Matmuls only, so inductor hands every op to an external kernel and compiles no C++: seconds per graph on a CPU.
class MatmulBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(FEATURES) + 0.01 * torch.randn(FEATURES, FEATURES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class MatmulStack(nn.Module):
    """A scale, then two alike blocks: regional compilation compiles one graph for both. (The scale makes the first
    block's input require grad like the second's, as an embedding does: else the first block's graph is another.)"""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(FEATURES))
        self.blocks = nn.ModuleList(MatmulBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.scale
        for block in self.blocks:
            x = block(x)
        return x


class PrintingNet(nn.Module):
    """Prints between its two matmuls: torch.compile breaks the graph there."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = MatmulBlock(), MatmulBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        print("batch of", x.shape[0])
        return self.second(x)


class ShrinkingBatches:
    """A collate_fn whose every batch is one sample shorter than the one before: a new shape every step."""

    def __init__(self) -> None:
        self.batches = 0

    def __call__(self, items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        keep = max(2, len(items) - self.batches)
        self.batches += 1
        return torch.stack([x for x, _ in items[:keep]]), torch.stack([y for _, y in items[:keep]])


def halving_workload() -> Workload:
    """One bias-free matmul learning to halve its input (AdamW at 3e-2: its loss falls five-fold in ten steps). Its
    compiled graph is matmuls alone, for which inductor writes no C++: a cold compile takes ~1 s here, where a model
    with pointwise ops (TinyNet's ReLU and biases) waits ~60 s on the C++ compiler."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(128, FEATURES, generator=generator)
    return Workload(model=MatmulBlock, dataset=(inputs, 0.5 * inputs), loss_fn=F.mse_loss, batch_size=16,
                    optimizer=functools.partial(torch.optim.AdamW, lr=3e-2), name="halving")


def matmul_workload(model: type[nn.Module], **kwargs) -> Workload:
    """``model`` regressing random targets of its own width (mean squared error, computed outside the model)."""
    generator = torch.Generator().manual_seed(0)
    data = torch.randn(128, FEATURES, generator=generator), torch.randn(128, FEATURES, generator=generator)
    return Workload(model=model, dataset=data, loss_fn=F.mse_loss, batch_size=16, name="matmul", **kwargs)


class FailsOnceFlagged(TinyNet):
    """Raises from forward while the file ``flag`` exists: a test makes a later window of a held burst fail."""

    def __init__(self, flag: str) -> None:
        super().__init__()
        self.flag = flag

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.path.exists(self.flag):
            raise RuntimeError("flagged to fail")
        return super().forward(x)


# -- Hugging Face models with random weights, built from a config (no download) ---------------------------------
class TokenItems(torch.utils.data.Dataset):
    """Random token windows as Hugging Face items: ``input_ids`` and ``labels`` (and ``attention_mask`` for a
    masked LM), so the loop calls ``model(**batch)`` and reads the model's own loss."""

    def __init__(self, n: int, seq_len: int, vocab_size: int, *, masked: bool = False) -> None:
        self.ids = torch.randint(0, vocab_size, (n, seq_len), generator=torch.Generator().manual_seed(0))
        self.masked = masked

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.ids[index]
        if self.masked:
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        return {"input_ids": ids, "labels": ids}


def _hf_gpt2(**config: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(**config))


def _hf_bert(**config: int) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(**config))


def hf_gpt2_workload(*, n_layer: int = 12, n_embd: int = 768, n_head: int = 12, vocab_size: int = 50257,
                     seq_len: int = 1024, batch_size: int = 8) -> Workload:
    """transformers' GPT-2 with random weights (the defaults: GPT-2 small, 124M parameters)."""
    model = functools.partial(_hf_gpt2, n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size,
                              n_positions=max(seq_len, 32), bos_token_id=0, eos_token_id=0)
    return Workload(model=model, dataset=TokenItems(4 * batch_size, seq_len, vocab_size), batch_size=batch_size,
                    name=f"hf-gpt2-{n_layer}x{n_embd}")


def hf_bert_workload(*, layers: int = 12, hidden: int = 768, heads: int = 12, vocab_size: int = 30522,
                     seq_len: int = 512, batch_size: int = 8) -> Workload:
    """transformers' BERT for masked LM with random weights (the defaults: BERT base, 110M parameters)."""
    model = functools.partial(_hf_bert, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                              intermediate_size=4 * hidden, vocab_size=vocab_size,
                              max_position_embeddings=max(seq_len, 32))
    return Workload(model=model, dataset=TokenItems(4 * batch_size, seq_len, vocab_size, masked=True),
                    batch_size=batch_size,
                    name=f"hf-bert-{layers}x{hidden}")


#: A user's models.py, edited between bursts (the tests of the code a rank runs). The model's output and the dataset's
#: target say which version ran: (output - target)^2 is 1 before the edit, 4 after it, and 9 or 0 for a rank that ran
#: one half of each.
MODELS = '''
import torch
from torch import nn

OUTPUT, TARGET = {output}, {target}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.w * 0 + OUTPUT + 0 * x[:, :1]


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.ones(4), torch.full((1,), TARGET)
'''
