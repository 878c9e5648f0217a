"""The Jupyter tuning panel: ``TuningPanel(workload)`` shows every knob, runs bursts and compares them.

A plain state (``state.py``), actions that change it off the main thread (``controller.py``) and a view that
renders it (``view.py``, ``controls.py``, ``plots.py``, ``table.py``). This subpackage is the only part of
accel_widgets that imports ipywidgets; ``import accel_widgets`` stays free of it and of plotly
(``accel_widgets.TuningPanel`` imports this lazily).
"""

from .view import TuningPanel

__all__ = ["TuningPanel"]
