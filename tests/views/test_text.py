"""Records in words: the summary every face prints (``aw.summary``), read from the record alone, for every kind."""

import pytest

import accel_widgets as aw
from accel_widgets import BatchSizeSearch, Config, SweepResult, TuneResult
from accel_widgets.results.batchsize import BatchTry
from accel_widgets.results.burst import ErrorInfo
from accel_widgets.results.sweep import SweepPoint
from accel_widgets.results.tune import TuneStep
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


def test_every_kind_of_record_reads_through_the_one_summary():
    """The public face's summary is this one, and each record kind is registered with it."""
    assert aw.summary is summary
    tuned = TuneResult(Config(num_workers=2), 150.0, 100.0, [TuneStep("num_workers", 2, True, "faster")],
                       [make_result()], 1.5, "done")
    assert summary(tuned).splitlines() == [
        "best: num_workers=2 (its speed-up over the start not measured; baseline 100.0 samples/s, best 150.0 "
        "samples/s), 1 bursts in 1.5 s; done", "  + num_workers=2: faster"]
    swept = SweepResult("w", ["num_workers"], [SweepPoint({"num_workers": 0}, Config())], [], Config(), 60.0)
    assert summary(swept).splitlines() == ["sweep of num_workers on w against baseline, 1 points",
                                           "  num_workers=0: not run"]
    search = BatchSizeSearch("w", Config(), "CPU", "rss", None, "", "per process", (BatchTry(8, True, "grow"),))
    assert summary(search).splitlines()[0] == "batch size per process: largest that fits 8, fastest –"


def test_a_record_without_a_summary_is_refused_by_name():
    with pytest.raises(TypeError, match="no summary for a dict"):
        summary({})
