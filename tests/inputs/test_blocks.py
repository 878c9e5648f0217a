"""A model's repeated blocks: found in the structures models have (transformers' GPT-2 and BERT, a plain stack), or
named by the workload, and a wrong name said before anything runs."""

from __future__ import annotations

import pytest
import torch.nn.functional as F
from torch import nn

from accel_widgets import Workload
from accel_widgets.demos.lm import TinyGPT
from accel_widgets.inputs.blocks import BlocksNotFound, block_modules, find_blocks
from tests.workloads import TinyNet, WideBlocks, tensors

transformers = pytest.importorskip("transformers")


def gpt2() -> nn.Module:
    config = transformers.GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=3, n_head=2)
    return transformers.GPT2LMHeadModel(config)


def bert() -> nn.Module:
    config = transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    return transformers.BertForSequenceClassification(config)


def test_transformers_layers_are_found_with_their_share_of_the_parameters():
    found = find_blocks(gpt2())
    assert (found.path, found.kind, found.count) == ("transformer.h", "GPT2Block", 3)
    assert 0.5 < found.parameter_share < 1.0  # the tied embeddings and the last norm are not blocks
    assert found.text().startswith("3 x GPT2Block at transformer.h (")
    found = find_blocks(bert())
    assert (found.path, found.kind, found.count) == ("bert.encoder.layer", "BertLayer", 2)


def test_stacks_that_are_not_alike_are_no_blocks():
    growing = nn.Sequential(nn.Sequential(nn.Linear(4, 8)), nn.Sequential(nn.Linear(8, 16)))  # one class, two shapes
    assert find_blocks(growing) is None
    assert find_blocks(TinyNet()) is None
    mixed = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    assert find_blocks(mixed) is None


def test_the_stack_with_the_most_parameters_wins_and_a_named_one_is_taken_as_it_is():
    model = nn.Module()
    model.small = nn.ModuleList(nn.Linear(2, 2) for _ in range(6))
    model.large = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
    assert find_blocks(model).path == "large"
    named = find_blocks(model, "small")
    assert (named.path, named.count, named.kind) == ("small", 6, "Linear")


def test_a_wrong_name_says_which_stacks_the_model_has_before_any_process_starts():
    with pytest.raises(BlocksNotFound, match=r"Workload.blocks='transformer.layers': GPT2LMHeadModel has no "
                                             r"submodule 'transformer.layers'; .*'transformer.h' \(3 x GPT2Block\)"):
        Workload(model=gpt2(), dataset=tensors(), loss_fn=F.cross_entropy, blocks="transformer.layers")
    with pytest.raises(TypeError, match=r"Workload\.blocks must be the dotted path"):
        Workload(model=TinyNet(), dataset=tensors(), loss_fn=F.cross_entropy, blocks=3)
    # a factory's model is built in the rank, and checked there
    Workload(model=TinyNet, dataset=tensors(), loss_fn=F.cross_entropy, blocks="layers")


# -- repeated blocks -------------------------------------------------------------------------------------------------
class EncoderDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.ModuleList(TinyNet() for _ in range(3))
        self.decoder = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2)))
        self.mixed = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))  # not one class
        self.single = nn.ModuleList([TinyNet()])  # one block is no stack
        self.activations = nn.ModuleList([nn.ReLU(), nn.ReLU()])  # no parameters


def test_the_repeated_blocks_are_the_outermost_stacks_of_one_class():
    gpt = TinyGPT(vocab_size=16, seq_len=8, n_layer=4, d_model=8, n_head=2)
    assert block_modules(gpt) == list(gpt.blocks)
    model = EncoderDecoder()
    assert block_modules(model) == [*model.encoder, *model.decoder]  # not the Linears inside the decoder
    assert block_modules(WideBlocks(16, blocks=2))[0] is not None
    assert block_modules(TinyNet()) == []
    stack = nn.Sequential(TinyNet(), TinyNet())
    assert block_modules(stack) == list(stack)  # the root itself may be the stack


def test_a_named_stack_is_the_blocks_every_knob_wraps():
    model = EncoderDecoder()
    assert block_modules(model, "decoder") == list(model.decoder)
    with pytest.raises(BlocksNotFound, match="no submodule 'nowhere'"):
        block_modules(model, "nowhere")
