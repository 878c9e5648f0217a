"""What a burst measured, and the store of every burst: :mod:`.burst` and :mod:`.history`."""

from ..data.streams import StreamReading
from .burst import (
    BurstPhase,
    BurstResult,
    ErrorInfo,
    OperatorTime,
    PhaseName,
    ProfileCapture,
    RankSummary,
    Reliability,
    Status,
    StepRecord,
    TelemetrySample,
)

__all__ = ["BurstPhase", "BurstResult", "ErrorInfo", "OperatorTime", "PhaseName", "ProfileCapture", "RankSummary",
           "Reliability", "Status", "StepRecord", "StreamReading", "TelemetrySample"]
