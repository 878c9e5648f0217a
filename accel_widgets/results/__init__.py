"""Records: what a burst measured (:mod:`.burst`), whether it can rank a knob (:mod:`.reliability`), what a
comparison, a headspace and each search found (:mod:`.comparison`, :mod:`.headspace`, :mod:`.batchsize`,
:mod:`.sweep`, :mod:`.tune`, :mod:`.noise`), and the store of every burst (:mod:`.history`). Outcomes only: how a
record reads in words and figures is :mod:`accel_widgets.views`'."""

from ..data.streams import StreamReading
from .burst import (
    BurstPhase,
    BurstResult,
    ErrorInfo,
    OperatorTime,
    PhaseName,
    ProfileCapture,
    RankSummary,
    Status,
    StepRecord,
    TelemetrySample,
)
from .reliability import Reliability

__all__ = ["BurstPhase", "BurstResult", "ErrorInfo", "OperatorTime", "PhaseName", "ProfileCapture", "RankSummary",
           "Reliability", "Status", "StepRecord", "StreamReading", "TelemetrySample"]
