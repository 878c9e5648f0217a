"""accel_widgets: make PyTorch training faster by measurement, not folklore.

Hand it your model and data, flip the classic speed-ups one at a time, and each flip runs a short
timed training burst in an isolated worker process::

    import accel_widgets as aw
    wl = aw.Workload(model=MyNet(), dataset=my_ds, loss_fn=F.cross_entropy)
    base = aw.run_burst(wl, aw.Config(), steps=40)
    fast = aw.run_burst(wl, aw.Config(num_workers=2, precision="bf16"), steps=40)
    print(fast.samples_per_s / base.samples_per_s, aw.summary(fast))

Importing this package pulls in neither the UI (ipywidgets, plotly) nor CUDA. It starts the
forkserver that bursts are launched from, so that it has imported torch by the first burst.
"""

from .engine.forkserver import prestart_on_import

prestart_on_import(package_imported=False)  # first: a spawned server imports torch while this process does too

from .analysis.diagnosis import Finding, diagnose
from .analysis.estimate import Estimate, estimate
from .analysis.guard import GuardVerdict, check_training
from .demos import demo_workload
from .engine.launcher import BurstEngine, IsolationWarning, WorkloadNotPicklable, run_burst
from .engine.outcome import BurstError, BurstTimeout, ClusterError, WorkerCrashed, WorkerError, WorkerOutOfMemory
from .engine.payload import UserCodeWarning
from .engine.request import BurstOptions, BurstRequestError, RayCluster
from .inputs.device import DeviceInfo, probe_device
from .inputs.workload import Workload
from .job.export import export_script
from .job.recipe import Recipe, recipe
from .knobs import KNOBS, Knob, KnobValueError
from .knobs.config import Config
from .knobs.rules import ConfigError, check_config
from .results.batchsize import BatchSizeSearch
from .results.burst import BurstPhase, BurstResult, StepRecord
from .results.comparison import Comparison
from .results.headspace import Headspace
from .results.history import HistoryError, RunHistory
from .results.noise import NoiseBand
from .results.sweep import SweepResult
from .results.tune import TuneResult
from .search.batchsize import find_batch_size
from .search.compare import compare
from .search.headspace import headspace
from .search.ladder import Ladder, Rung, classic_ladder, run_ladder
from .search.remeasure import remeasure
from .search.sweep import sweep
from .search.tuner import measure_noise, tune
from .views import figures
from .views.report import write_csv, write_json
from .views.report import write_report as report
from .views.text import summary

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``aw.TuningPanel`` imports the panel (ipywidgets, plotly) only when first asked for."""
    if name == "TuningPanel":
        from .panel import TuningPanel

        return TuningPanel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The public face (docs/api.md, one line a name): what the README, the notebooks and the docs use, the types these
#: functions return and the errors and warnings they raise. Everything else is imported from its room.
__all__ = [
    "KNOBS",
    "BatchSizeSearch",
    "BurstEngine",
    "BurstError",
    "BurstOptions",
    "BurstPhase",
    "BurstRequestError",
    "BurstResult",
    "BurstTimeout",
    "ClusterError",
    "Comparison",
    "Config",
    "ConfigError",
    "DeviceInfo",
    "Estimate",
    "Finding",
    "GuardVerdict",
    "Headspace",
    "HistoryError",
    "IsolationWarning",
    "Knob",
    "KnobValueError",
    "Ladder",
    "NoiseBand",
    "RayCluster",
    "Recipe",
    "RunHistory",
    "Rung",
    "StepRecord",
    "SweepResult",
    "TuneResult",
    "TuningPanel",
    "UserCodeWarning",
    "WorkerCrashed",
    "WorkerError",
    "WorkerOutOfMemory",
    "Workload",
    "WorkloadNotPicklable",
    "check_config",
    "check_training",
    "classic_ladder",
    "compare",
    "demo_workload",
    "diagnose",
    "estimate",
    "export_script",
    "figures",
    "find_batch_size",
    "headspace",
    "measure_noise",
    "probe_device",
    "recipe",
    "remeasure",
    "report",
    "run_burst",
    "run_ladder",
    "summary",
    "sweep",
    "tune",
    "write_csv",
    "write_json",
]

prestart_on_import(package_imported=True)  # last: a fork of this process holds the whole package
