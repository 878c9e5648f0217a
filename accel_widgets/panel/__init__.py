"""The Jupyter tuning panel: ``TuningPanel(workload)`` shows every knob, runs bursts and compares them.

This subpackage is the only part of accel_widgets that imports ipywidgets and plotly; ``import
accel_widgets`` stays free of both (``accel_widgets.TuningPanel`` imports this lazily).
"""

from ..diagnosis import Finding, diagnose
from .view import TuningPanel

__all__ = ["Finding", "TuningPanel", "diagnose"]
