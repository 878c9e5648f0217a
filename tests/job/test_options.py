"""A job's flags: one declaration for the script, train() and the docs; a bad flag fails before anything trains."""

from __future__ import annotations

import argparse

import pytest

from accel_widgets.job.options import JobOptions, argparse_lines


def test_the_scripts_flags_are_the_options_fields_and_parse_back_into_them() -> None:
    parser = argparse.ArgumentParser()
    exec("\n".join(line.strip() for line in argparse_lines()), {"parser": parser})
    flags = ["--steps", "20", "--checkpoint-dir", "c", "--checkpoint-every", "4", "--checkpoint-minutes", "1.5",
             "--resume", "--save-model", "m.pt"]
    options = JobOptions(**vars(parser.parse_args(flags)))
    assert options == JobOptions(steps=20, checkpoint_dir="c", checkpoint_every=4, checkpoint_minutes=1.5,
                                 resume=True, save_model="m.pt")
    assert options.log_path == "c/log.jsonl"
    assert JobOptions(**vars(parser.parse_args([]))) == JobOptions()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"steps": 0}, "--steps 0: use a whole number >= 1"),
    ({"log_every": 2.5}, "--log-every 2.5"),
    ({"checkpoint_every": 4}, "--checkpoint-every need\\(s\\) --checkpoint-dir DIR"),
    ({"resume": True, "checkpoint_minutes": 5}, "--checkpoint-minutes and --resume need"),
    ({"checkpoint_dir": "c", "checkpoint_minutes": float("nan")}, "--checkpoint-minutes nan: use a number of minutes"),
])
def test_a_bad_flag_fails_naming_it(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobOptions(**kwargs)
