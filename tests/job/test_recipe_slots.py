"""Every slot a knob's recipe line can name is laid out by the recipe, and no other slot can be named: a line is never
dropped in silence."""

from __future__ import annotations

import pytest

import accel_widgets as aw
from accel_widgets import Config
from accel_widgets.knobs import OWNERS
from accel_widgets.knobs.base import RECIPE_SLOTS, STYLES, Code, RecipeContext, RecipePart


@pytest.mark.parametrize("slot", RECIPE_SLOTS)
def test_every_slot_is_laid_out_in_some_style(monkeypatch: pytest.MonkeyPatch, slot: str) -> None:
    """A line in ``slot`` from the first owner's first knob (so it comes first where the recipe takes one line of a
    slot: the loss read, the loss scale) shows up in the code of at least one style."""
    knob = OWNERS[0].knobs[0].name
    marker = f"import marker_{slot.replace('_', '')}"  # an import line: the "imports" slot sorts its lines as imports

    def entry(config: Config, context: RecipeContext) -> list[RecipePart]:
        return [Code(knob, slot, marker)]

    for style in STYLES:
        monkeypatch.setitem(OWNERS[0].recipe[knob], style, entry)
    assert any(marker.removeprefix("import ") in aw.recipe(Config(), style=style).code for style in STYLES)


def test_a_line_in_an_unknown_slot_is_refused() -> None:
    with pytest.raises(ValueError, match=r"num_workers's recipe line is in slot 'stepp', which no recipe lays out"):
        Code("num_workers", "stepp", "pass")  # type: ignore[arg-type]
