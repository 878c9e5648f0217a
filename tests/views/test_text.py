"""A burst in words: the summary every face prints (``aw.summary``), read from the record alone."""

import pytest

from accel_widgets import ErrorInfo
from accel_widgets.views.text import summary
from tests.results.test_burst import compiled_result, make_diverged, make_result


def test_summary_text():
    fast = make_result()
    text = summary(fast)
    assert "samples/s" in text and "data wait 25%" in text and "compile" in text
    failed = make_result(status="failed", error=ErrorInfo("oom", "OutOfMemoryError: boom"))
    assert "OutOfMemoryError: boom" in summary(failed)


def test_the_summary_says_what_compile_did():
    result = compiled_result()
    lines = summary(result).splitlines()
    assert "  compile     1.9 s (first step 2.0 s); 4 graphs, 3 graph breaks, 3 recompiles; torch compiled for 12.5 s" \
        in lines
    assert "  compiled    the whole model" in lines
    assert "  graph break 3x at model.py:42 in forward (`print(x.shape)`): Failed to trace builtin operator" in lines
    assert ("  recompiled  3x in forward (model.py:40): tensor 'x' size mismatch at index 1. expected 48, actual 64"
            in lines)
    assert "graph" not in summary(make_result())  # nothing compiled: nothing said


def test_diverged_summary_says_why_and_still_shows_the_numbers():
    text = summary(make_diverged(label="bf16"))
    head, *rest = text.splitlines()
    assert head.startswith("bf16 [w] diverged: loss is NaN from step 2 on rank 1")
    assert any(line.strip().startswith("throughput") for line in rest)
    assert any("step" in line and "median" in line for line in rest)


def test_a_record_without_a_summary_is_refused_by_name():
    with pytest.raises(TypeError, match="no summary for a dict"):
        summary({})
