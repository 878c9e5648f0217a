"""The timeline's utilisation half with NVML's GPM lines beside utilisation, and the report's utilisation panels."""

from __future__ import annotations

from typing import Any

import pytest

from accel_widgets import Config
from accel_widgets.analysis.compare import comparison_rows
from accel_widgets.views.figures import utilisation_figure
from accel_widgets.views.timeline import ACTIVITY_NOTE, step_times_only, timeline
from tests.measured import H200_BF16_ACTIVITY, H200_FP32_ACTIVITY, h200_result


def _traces(figure: Any, kind: str) -> list[Any]:
    return [t for t in figure.data if isinstance(t.meta, dict) and t.meta.get("kind") == kind]


def test_sm_active_and_tensor_active_are_drawn_beside_each_gpus_utilisation():
    """An fp32 and a bf16 GPT run on an H200: utilisation 98% in both, the tensor cores 12% against 55%."""
    runs = [h200_result(activity=H200_FP32_ACTIVITY), h200_result(Config(precision="bf16"),
                                                                  activity=H200_BF16_ACTIVITY)]
    figure = timeline(runs, ["#0 fp32", "#1 bf16"])
    util, sm, tensor = (_traces(figure, kind) for kind in ("util", "sm_active", "tensor_active"))
    assert [t.meta["run"] for t in util] == [t.meta["run"] for t in sm] == [t.meta["run"] for t in tensor] == [0, 1]
    assert all(t.xaxis == "x" and t.meta["device"] == "cuda:0" for t in [*util, *sm, *tensor])
    assert set(util[0].y) == {98.0} and set(tensor[0].y) == {12.0} and set(tensor[1].y) == {55.0}
    assert set(sm[1].y) == {78.0} and list(sm[0].x) == list(util[0].x)
    assert (sm[0].line.dash, tensor[0].line.dash) == ("dot", "dash")
    assert sm[0].line.color == util[0].line.color and sm[0].legendgroup == "run0" and not sm[0].showlegend
    assert "tensor active 12%" in tensor[0].hovertemplate.replace("%{y:.0f}%", "12%")
    assert figure.layout.yaxis.title.text == "GPU utilisation % (NVML)" + ACTIVITY_NOTE
    assert _traces(step_times_only(figure), "sm_active") == []  # the report's timeline: step times alone


def test_a_gpu_without_gpm_draws_utilisation_alone():
    figure = timeline([h200_result()], ["#0"])
    assert len(_traces(figure, "util")) == 1 and _traces(figure, "sm_active") == _traces(figure, "tensor_active") == []
    assert figure.layout.yaxis.title.text == "GPU utilisation % (NVML)"


def test_the_reports_utilisation_panels_carry_the_gpm_lines_and_means():
    runs = [h200_result(activity=H200_FP32_ACTIVITY), h200_result(Config(precision="bf16"),
                                                                  activity=H200_BF16_ACTIVITY)]
    figure = utilisation_figure(runs, comparison_rows(runs))
    tensor = _traces(figure, "tensor_active")
    assert [t.meta["run"] for t in tensor] == [0, 1] and (tensor[0].xaxis, tensor[1].xaxis) == ("x", "x2")
    titles = [a.text for a in figure.layout.annotations]
    assert titles[0].endswith(" · mean 98% · SM 61% · tensor 12%")
    assert titles[1].endswith(" · mean 98% · SM 78% · tensor 55%")
    assert figure.layout.title.text == ("GPU utilisation % (NVML)" + ACTIVITY_NOTE
                                        + " per run, against time since launch (s)")
    assert pytest.approx(list(tensor[1].y)) == [55.0] * len(tensor[1].y)
