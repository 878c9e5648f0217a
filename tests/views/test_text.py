"""Records in words: the summary every face prints (``aw.summary``), read from the record alone, for every kind, and a
finding's one sentence, the same in the panel, the report and the CLI."""

import html
import re

import pytest

import accel_widgets as aw
from accel_widgets import BatchSizeSearch, Config, SweepResult, TuneResult
from accel_widgets.analysis.diagnosis import Finding, diagnose
from accel_widgets.results.batchsize import BatchTry
from accel_widgets.results.burst import ErrorInfo
from accel_widgets.results.sweep import SweepPoint
from accel_widgets.results.tune import TuneStep
from accel_widgets.views.text import finding_line, finding_sentence, findings_html, run_findings, summary
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


# -- a finding's one sentence ----------------------------------------------------------------------------------------
def shown(markup: str) -> str:
    """What a reader of the panel's or the report's HTML sees: the tags taken out, the entities read."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def test_a_finding_is_one_sentence_that_the_html_shows_after_its_mark():
    data_bound = Finding("warn", "Data-bound", "60% of the step waits on the data loader: add <workers>.",
                         "num_workers")
    busy = Finding("good", "Device kept busy", "worker CPU at 90% (rule of thumb: > 80%).")
    assert finding_sentence(data_bound) == "Data-bound: 60% of the step waits on the data loader: add <workers>. → " \
        "try num_workers"
    assert finding_sentence(busy) == "Device kept busy: worker CPU at 90% (rule of thumb: > 80%)."
    assert [finding_line(f) for f in (data_bound, busy)] == ["⚠ " + finding_sentence(data_bound),
                                                              "✔ " + finding_sentence(busy)]
    markup = findings_html([data_bound, busy])
    assert "<b>Data-bound</b>: 60% of the step waits on the data loader: add &lt;workers&gt;." in markup
    assert shown(markup) == finding_line(data_bound) + finding_line(busy)


def test_the_report_and_the_cli_leave_the_engine_warnings_to_their_own_lines():
    result = make_result(warnings=["only 3 measured steps"])
    assert "Engine warning" in [f.title for f in diagnose(result)]  # the panel's reading lists it
    assert run_findings(result) == [f for f in diagnose(result) if f.title != "Engine warning"]
    assert "only 3 measured steps" in summary(result)
