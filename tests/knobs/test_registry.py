import copy
import dataclasses
import json
import math
import pickle

import pytest

from accel_widgets import KNOBS, Config, KnobValueError
from accel_widgets.knobs import GROUPS


def test_config_fields_mirror_the_registry():
    fields = {f.name: f.default for f in dataclasses.fields(Config)}
    assert list(fields) == list(KNOBS)
    assert fields == KNOBS.defaults()


def test_every_knob_is_documented_and_grouped():
    for knob in KNOBS.values():
        assert knob.group in GROUPS
        assert knob.what and knob.why and knob.when
        assert set(knob.applies_to) <= {"cpu", "cuda"}
    assert {k.group for k in KNOBS.values()} == set(GROUPS)


def test_default_config_is_the_plain_loop():
    config = Config()
    assert config.precision == "fp32" and config.num_workers == 0 and config.compile_mode == "off"
    assert config.label() == "baseline"


@pytest.mark.parametrize(
    ("changes", "expected_text"),
    [
        ({"precision": "fp8"}, "one of 'fp32', 'bf16', 'fp16'"),
        ({"num_workers": -1}, "[0, 64]"),
        ({"num_workers": 1.5}, "num_workers=1.5"),
        ({"pin_memory": "yes"}, "True or False"),
        ({"compile_mode": "fast"}, "'reduce-overhead'"),
        ({"memory_fraction": 2.0}, "[0.05, 1]"),
        ({"batch_size": 0}, "or None"),
    ],
)
def test_invalid_values_name_the_valid_ones(changes, expected_text):
    with pytest.raises(KnobValueError) as info:
        Config(**changes)
    assert expected_text in str(info.value)


def test_unknown_knob_lists_known_ones():
    with pytest.raises(KnobValueError, match="known knobs are batch_size, num_workers"):
        Config().replace(num_wrokers=2)
    with pytest.raises(KnobValueError, match="unknown knob 'speed'"):
        Config.from_dict({"speed": 11})


def test_unknown_keyword_to_the_constructor_names_the_closest_knob():
    with pytest.raises(KnobValueError) as info:
        Config(num_wrkers=2)
    message = str(info.value)
    assert "unknown knob 'num_wrkers' (did you mean 'num_workers'?)" in message
    assert "known knobs are batch_size, num_workers" in message
    with pytest.raises(KnobValueError, match="did you mean 'precision'"):
        dataclasses.replace(Config(), precison="bf16")


def test_config_stays_a_dataclass_with_its_checks():
    config = Config(num_workers=2)
    assert dataclasses.replace(config, precision="bf16") == Config(num_workers=2, precision="bf16")
    assert pickle.loads(pickle.dumps(config)) == config
    assert copy.deepcopy(config) == config
    assert Config(2).batch_size == 2  # positional arguments still reach the generated __init__


@pytest.mark.parametrize("name", ["batch_size", "memory_fraction", "num_workers", "world_size"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_rejected(name, value):
    with pytest.raises(KnobValueError, match=f"{name}={value!r} is not a finite number: use "):
        Config(**{name: value})
    with pytest.raises(KnobValueError, match="not a finite number"):
        KNOBS[name].parse(str(value))


def test_config_is_frozen_hashable_and_round_trips_json():
    config = Config(num_workers=2, precision="bf16", memory_fraction=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_workers = 3  # type: ignore[misc]
    assert {config: 1}[Config(num_workers=2, precision="bf16", memory_fraction=0.5)] == 1
    assert Config.from_json(config.to_json()) == config
    assert json.loads(config.to_json())["precision"] == "bf16"


def test_diff_and_label_name_only_changed_knobs():
    config = Config(num_workers=2, precision="bf16")
    assert config.diff() == {"num_workers": 2, "precision": "bf16"}
    assert config.label() == "num_workers=2, precision=bf16"
    assert config.replace(compile_mode="default").label(config) == "compile_mode=default"


def test_the_compact_label_shortens_each_knob_as_its_owner_says():
    """What a table cell that must fit shows: switches by name (off: "no ..."), values after a short name, and a
    value that names itself alone."""
    config = Config(num_workers=2, pin_memory=True, precision="bf16", compile_mode="default",
                    reshard_after_forward=False)
    assert config.compact_label() == "workers 2, pin, bf16, compile default, no reshard"
    assert config.compact_label(Config(num_workers=2, pin_memory=True)) == "bf16, compile default, no reshard"
    assert Config().compact_label() == "baseline" and Config(tf32=True).compact_label() == "tf32"  # its own name
    assert all(len(knob.compact(knob.default)) <= 24 for knob in KNOBS.values()), "short means short"


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [("num_workers", "4", 4), ("pin_memory", "true", True), ("pin_memory", "off", False),
     ("precision", "bf16", "bf16"), ("memory_fraction", "0.5", 0.5), ("memory_fraction", "none", None),
     ("batch_size", "128", 128)],
)
def test_parse_command_line_values(name, text, value):
    assert KNOBS[name].parse(text) == value


def test_parse_rejects_nonsense_with_the_valid_values():
    with pytest.raises(KnobValueError, match="in \\[0, 64\\]"):
        KNOBS["num_workers"].parse("many")


def test_ranks_only_count_for_ddp():
    assert Config(parallel="ddp", world_size=2).ranks == 2
    assert Config().ranks == 1


def test_docs_are_generated_from_the_registry():
    from pathlib import Path

    from accel_widgets.cli import knobs_markdown

    docs = Path(__file__).resolve().parents[2] / "docs" / "knobs.md"
    assert docs.read_text() == knobs_markdown() + "\n", "regenerate: accel-widgets knobs --markdown > docs/knobs.md"
