"""What a burst measured, whether it can rank a knob, and the store of every burst: :mod:`.burst`,
:mod:`.reliability` and :mod:`.history`."""

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
