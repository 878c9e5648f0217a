""""Use in my code" under the runs table: it names the best run as runs finish, and builds its code only when asked."""

from __future__ import annotations

from typing import Any

import pytest

from accel_widgets import Config
from accel_widgets.panel import recipe as panel_recipe
from accel_widgets.results.burst import BurstResult
from tests.panel.fakes import FakeEngine, synthetic_result
from tests.panel.test_panel import make_panel, run


def test_the_best_runs_settings_are_built_as_code_when_asked_in_the_style_picked(monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    built = []
    real = panel_recipe.recipe
    monkeypatch.setattr(panel_recipe, "recipe", lambda *args: built.append(args) or real(*args))
    panel = make_panel(FakeEngine(), steps=6)
    assert panel.recipe.button.disabled  # no run yet
    run(panel)
    panel.set_config(Config(num_workers=1))
    run(panel)
    best = panel.recipe.best
    assert best is not None and panel.recipe.button.description == f"Use #{best.run} in my code"
    assert built == [] and panel.recipe.box.layout.display == "none"  # nothing built while runs come in

    panel.recipe.button.click()
    assert panel.recipe.box.layout.display is None
    assert "def train(model, dataset, loss_fn, make_optimizer, steps, seed=0" in panel.recipe.code.value
    assert panel.recipe.copy.text == panel.recipe.code.value
    panel.recipe.styles.value = "hf"
    assert "TrainingArguments(" in panel.recipe.code.value
    assert [args[0] for args in built] == [best.result.config] * 2 and [args[2] for args in built] == ["pytorch", "hf"]


def test_with_every_run_measured_under_other_load_the_button_says_why_there_is_nothing_to_take() -> None:
    """A busy laptop: each run measured while another job took 40% of the machine. No run is the best, and the
    disabled button's hover says why and what to do, instead of staying grey in silence."""

    def loaded(workload: Any, config: Config, **kwargs: Any) -> BurstResult:
        return synthetic_result(config, step_s=0.05, util=40, foreign=40)

    panel = make_panel(loaded, steps=6)
    assert panel.recipe.button.tooltip == "no run to take yet: no run has finished yet"
    run(panel)
    panel.set_config(Config(num_workers=1))
    run(panel)
    assert panel.recipe.button.disabled and panel.recipe.best is None
    assert panel.recipe.button.tooltip.startswith("no run to take yet: every finished run was measured unreliably")
    assert "on a quiet machine" in panel.recipe.button.tooltip
