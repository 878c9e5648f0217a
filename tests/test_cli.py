"""``--workload MODULE:FUNCTION``: found in the current directory like ``python -m``, and every wrong reference is
a one-line error with a non-zero exit, not a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from accel_widgets.analysis.diagnosis import diagnose
from accel_widgets.cli import main
from accel_widgets.inputs.workload import WorkloadReferenceError, load_workload
from accel_widgets.results.burst import BurstResult
from accel_widgets.search.ladder import Ladder, Rung
from accel_widgets.views.text import finding_line, findings_html, run_findings
from tests.panel.fakes import synthetic_result
from tests.views.test_text import shown

MODULE = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from accel_widgets import Workload


    class Net(nn.Module):  # defined here, so a worker must import this module to rebuild the model
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(8, 2)

        def forward(self, x):
            return self.layer(x)


    def make():
        x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
        return Workload(model=Net(), dataset=(x, y), loss_fn=F.cross_entropy, batch_size=16, name="mywl")


    def not_a_workload():
        return 42
""")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A current directory holding ``mywl.py`` (and ``broken.py``, whose own import fails); ``sys.path`` and the
    imported modules are restored afterwards."""
    (tmp_path / "mywl.py").write_text(MODULE)
    (tmp_path / "broken.py").write_text("import a_dependency_that_is_not_installed\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    for name in ("mywl", "broken"):
        sys.modules.pop(name, None)


def test_a_module_in_the_current_directory_is_found(workdir: Path) -> None:
    workload = load_workload("mywl:make")
    assert workload.name == "mywl" and sys.path[0] == str(workdir)


@pytest.mark.parametrize(("reference", "message"), [
    ("mywl", "workload 'mywl': use MODULE:FUNCTION, e.g. mypkg.train:make_workload"),
    ("nosuchmodule:make", "workload 'nosuchmodule:make': no module named 'nosuchmodule' in the current directory "
                          "({cwd}) or on the Python path"),
    ("mywl:make_it", "workload 'mywl:make_it': module 'mywl' ({cwd}/mywl.py) has no 'make_it'"),
    ("mywl:not_a_workload", "workload 'mywl:not_a_workload' must return an accel_widgets.Workload, got int"),
])
def test_a_bad_reference_says_which_part_is_wrong(workdir: Path, reference: str, message: str) -> None:
    with pytest.raises(WorkloadReferenceError) as info:
        load_workload(reference)
    assert str(info.value) == message.format(cwd=workdir)


def test_a_missing_dependency_of_the_module_is_named_as_such(workdir: Path) -> None:
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_installed"):
        load_workload("broken:make")


def test_a_bad_reference_exits_non_zero_with_one_line(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--workload", "mywl:make_it", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accel-widgets: error: workload 'mywl:make_it'") and "Traceback" not in err


@pytest.mark.slow
def test_the_command_runs_a_workload_module_from_its_current_directory(workdir: Path) -> None:
    # -I keeps the current directory off sys.path, as for the installed `accel-widgets` script: the CLI must add it,
    # and the worker processes must find the module too (Net is pickled by reference to it).
    command = [sys.executable, "-I", "-m", "accel_widgets", "run", "--workload", "mywl:make", "--steps", "2"]
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("baseline [mywl] ok")


# -- every mistake before the first burst, in one line -------------------------------------------------------------
@pytest.fixture
def no_burst_may_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting a burst (or a ladder) is made an error: the CLI must reject its arguments first."""
    from accel_widgets import cli

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("a burst started before the arguments were checked")

    monkeypatch.setattr(cli, "run_ladder", started)
    monkeypatch.setattr(cli, "run_burst", started)


def test_demo_rejects_an_unknown_workload_before_the_first_ladder(no_burst_may_start: None,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workloads", "image,nope", "--steps", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "accel-widgets: error: --workloads 'image,nope': unknown demo 'nope'; valid names: image, lm, mlp\n"


@pytest.mark.parametrize("command", [["run", "--demo", "mlp", "--steps", "-3"], ["demo", "--steps", "-3"]],
                         ids=["run", "demo"])
def test_a_negative_step_count_fails_before_any_progress_line(no_burst_may_start: None, command: list[str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(command) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "accel-widgets: error: steps=-3 is invalid: use an integer, steps >= 1\n"


def test_export_creates_the_directories_of_its_output(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--workload", "mywl:make", "-o", "missing/dir/train.py"]) == 0
    assert "Training script exported by accel_widgets" in (workdir / "missing" / "dir" / "train.py").read_text()
    assert "wrote missing/dir/train.py" in capsys.readouterr().out


def test_export_to_a_path_it_cannot_write_is_one_line(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "a_file").write_text("")
    assert main(["export", "--workload", "mywl:make", "-o", "a_file/train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("accel-widgets: error: ") and "a_file" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1


def test_export_as_a_style_prints_the_settings_as_code(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--workload", "mywl:make", "--precision", "bf16", "--grad-accum-steps", "2", "--as",
                 "hf"]) == 0
    out = capsys.readouterr().out
    assert "args = TrainingArguments(" in out and "    bf16=True," in out and "gradient_accumulation_steps=2," in out
    assert main(["export", "--workload", "mywl:make", "--as", "pytorch", "-o", "mine/snippet.py"]) == 0
    assert "def train(model, dataset, loss_fn, make_optimizer, steps, seed=0" in (
        workdir / "mine" / "snippet.py").read_text()
    assert not (workdir / "train_ddp.py").exists()


def test_headspace_says_one_line_per_ceiling_and_writes_their_bars(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``accel-widgets headspace``: the config's knobs from the flags, one line per ceiling, the bars in the report
    (the measuring itself is ``aw.headspace``'s, tested with its bursts in tests/search/test_headspace.py)."""
    from accel_widgets import cli
    from tests.results.test_headspace import headspace_of

    asked = []

    def measured(workload, config, **kwargs):
        asked.append((workload.name, config.label(), kwargs["budget_s"]))
        return headspace_of({"data": [2.0, 2.2, 2.1, 1.9, 2.05]}, config, communication="one process")

    monkeypatch.setattr(cli, "headspace", measured)
    assert main(["headspace", "--demo", "image", "--num-workers", "2", "--budget", "9", "--report", "h.html"]) == 0
    assert asked == [("image-small", "num_workers=2", 9.0)]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Data free: ") and "can win at most" in out[0]
    assert out[1].startswith("Communication free: not measured: one process")
    assert out[2] == "report: h.html" and "Ceilings (1× to 4×, log)" in (workdir / "h.html").read_text()


# -- findings: the sentences the panel and the report show ---------------------------------------------------------
def test_run_prints_each_finding_in_the_words_of_the_panel(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``run`` prints the run's findings under its summary, each the line the panel's reading shows; the engine's
    warnings once, as the summary's own lines (a recorded result: a real burst adds nothing here)."""
    from accel_widgets import cli

    result = synthetic_result(data_s=0.03, warnings=["only 10 measured steps"])
    monkeypatch.setattr(cli, "run_burst", lambda *args, **kwargs: result)
    assert main(["run", "--demo", "mlp", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    panel = shown(findings_html(diagnose(result)))  # the panel's reading of a run that is its own baseline
    findings = run_findings(result)
    assert "Data-bound" in [f.title for f in findings]
    assert out.splitlines()[-len(findings):] == [f"  {finding_line(f)}" for f in findings]
    assert all(finding_line(f) in panel for f in findings)
    assert out.count("only 10 measured steps") == 1


def test_demo_prints_the_findings_of_each_workloads_best_rung_as_the_report_words_them(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """After the table, the demo says what the best rung could act on (its warnings, the findings that name a knob), in
    the sentences of the report's diagnosis; not the other rungs', not the notes the table's columns say already."""
    from accel_widgets import cli

    measured: list[BurstResult] = []

    def ladder(workload: object, rungs: list[Rung], *, on_result: Callable[[Rung, BurstResult], None],
               **kwargs: object) -> Ladder:
        for index, rung in enumerate(rungs):  # the baseline waits on data; every rung after it runs twice as fast
            measured.append(synthetic_result(rung.config, data_s=0.03 if index == 0 else 0.001,
                                             step_s=0.05 if index == 0 else 0.025, label=rung.name))
            on_result(rung, measured[-1])
        return Ladder(rungs, list(measured), {})

    monkeypatch.setattr(cli, "run_ladder", ladder)
    report = tmp_path / "demo.html"
    assert main(["demo", "--workloads", "mlp", "--no-compile", "--steps", "10", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    said = out.split("findings of each workload's best rung (the report has every run's):\n")[1].split("\n\n")[0]
    best, baseline = measured[1], measured[0]  # the first of the fastest rungs
    findings = run_findings(best, baseline)
    acted = [f for f in findings if f.severity == "warn" or f.knob]
    assert acted and len(acted) < len(findings)
    assert said.splitlines() == [f"  #1 {best.label} [fake]", *(f"    {finding_line(f)}" for f in acted)]
    assert "Data-bound" not in said  # the baseline's reading is in the report, not here
    shown_report = shown(report.read_text())
    assert all(finding_line(f) in shown_report for f in acted)
