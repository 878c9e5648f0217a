"""What a burst is asked for besides the config: how long to measure, warm up and wait, what to record, and where
it runs (this machine, or a Ray cluster: :class:`RayCluster`).

Two values, both checked when they are made, so a bad argument is refused before any process starts.
:class:`BurstOptions` is what a caller sets once and rarely: ``run_burst(..., options=BurstOptions(...))`` keeps the
everyday keywords (the length, the event stream, Stop, the label) few, and a search hands its options on whole.
:class:`BurstRequest` is one burst's length with its options, the value the ranks are given.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

from ..inputs.device import DeviceInfo
from ..knobs.base import Part
from ..knobs.parts import PARTS

#: Measured steps of a burst given neither steps nor seconds.
DEFAULT_STEPS = 40
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_PROFILE_DIR = "accel_widgets_profiles"

#: Where a burst trains: in worker processes (crash, out-of-memory and hang isolated) or in the caller.
Isolation = Literal["process", "inprocess"]
ISOLATIONS: tuple[Isolation, ...] = ("process", "inprocess")

#: How a cluster's placement group lays the ranks out (Ray's strategies): as few nodes as fit them, spread as far as
#: it can, or one node per rank at most.
Placement = Literal["PACK", "SPREAD", "STRICT_SPREAD"]
PLACEMENTS: tuple[Placement, ...] = ("PACK", "SPREAD", "STRICT_SPREAD")
#: How long a cluster burst waits for its ranks' places, its actors and their rendezvous, unless told.
DEFAULT_CLUSTER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RayCluster:
    """Run the burst's ranks as Ray actors on a Ray cluster (``pip install 'accel-widgets[ray]'``), one per rank.

    ``address``: what ``ray.init`` connects to: ``"auto"`` (the cluster this machine belongs to), ``"ray://host:port"``
    (Ray Client) or a GCS ``"host:port"``; a driver already connected keeps its connection. ``placement``: how the
    placement group lays the ranks' bundles out on the nodes (``"PACK"``, ``"SPREAD"``, ``"STRICT_SPREAD"``: one
    node per rank). Each bundle holds ``cpus_per_rank`` CPUs (the rank's threads and its DataLoader workers) and
    ``gpus_per_rank`` GPUs. ``timeout_s`` bounds each wait of the set-up in turn: for the ranks' places, for their
    actors to start, for their rendezvous; the training itself is bounded by the burst's own ``timeout_s``.
    """

    address: str = "auto"
    placement: Placement = "PACK"
    cpus_per_rank: float = 1.0
    gpus_per_rank: float = 0.0
    timeout_s: float = DEFAULT_CLUSTER_TIMEOUT_S

    def __post_init__(self) -> None:
        _raise_for([_address_problem(self.address), _choice_problem("placement", self.placement, PLACEMENTS),
                    _resource_problem("cpus_per_rank", self.cpus_per_rank, minimum=1.0),
                    _resource_problem("gpus_per_rank", self.gpus_per_rank, minimum=0.0),
                    _duration_problem("timeout_s", self.timeout_s, optional=False)])

    def bundle(self) -> dict[str, float]:
        """One rank's bundle of the placement group, as Ray names the resources."""
        return {"CPU": self.cpus_per_rank, **({"GPU": self.gpus_per_rank} if self.gpus_per_rank else {})}


@dataclass(frozen=True)
class BurstOptions:
    """How a burst runs besides its length: what it warms up, waits for and records, and where it trains.

    ``warmup_steps`` unmeasured steps before the window (None: the config's own,
    :func:`accel_widgets.knobs.compiling.default_warmup_steps`); ``timeout_s`` for the whole burst (on a cluster, from
    when its ranks are seated: :class:`RayCluster` bounds the set-up); ``profile_steps``
    more steady-state steps under torch.profiler after the window, their trace under ``profile_dir``; ``sync_debug``
    runs the window under CUDA's sync-debug mode. ``freed``: the part of the step the burst makes free, a headspace
    variant of the config (:mod:`accel_widgets.knobs.parts`); None trains the config as it is. ``isolation``
    "inprocess" trains in the caller, without crash isolation (for a workload that cannot be pickled); ``cache_dir``
    holds the data caches and compiled kernels (None: the project's cache root); ``device`` is the machine to plan for
    (None: probed). ``cluster``: run the ranks on a Ray cluster (:class:`RayCluster`) instead of this machine; None
    trains here.
    """

    warmup_steps: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    profile_steps: int = 0
    profile_dir: str = DEFAULT_PROFILE_DIR
    sync_debug: bool = False
    freed: Part | None = None
    isolation: Isolation = "process"
    cache_dir: str | None = None
    device: DeviceInfo | None = None
    cluster: RayCluster | None = None

    def __post_init__(self) -> None:
        _raise_for([*_option_problems(self.warmup_steps, self.timeout_s, self.profile_steps),
                    _freed_problem(self.freed), _choice_problem("isolation", self.isolation, ISOLATIONS),
                    _cluster_problem(self)])

    def over(self, base: BurstOptions) -> BurstOptions:
        """These options laid over ``base``: each field set here (away from its default) wins, the rest are ``base``'s;
        a field at its default, given or not, keeps ``base``'s.

        How an engine with options of its own takes the ones a search or the panel adds for a burst (a headspace's
        freed part, a profile, a timeout) without losing its own (``isolation="inprocess"``, a device)."""
        # Every field has a plain default (no factory): ``f.default`` is what an unset field holds.
        changed = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if getattr(self, f.name) != f.default}
        return dataclasses.replace(base, **changed)


@dataclass(frozen=True)
class BurstRequest:
    """One burst's length and its options: what its ranks are given.

    ``steps`` measured steps, or ``seconds`` of measuring (neither: ``DEFAULT_STEPS``). The ranks read the length
    and what to warm up, measure and record; where the burst runs (isolation, cache dir, device) is the launcher's.
    """

    steps: int | None = None
    seconds: float | None = None
    options: BurstOptions = field(default_factory=BurstOptions)

    def __post_init__(self) -> None:
        _raise_for(_length_problems(self.steps, self.seconds))

    def resolved(self, warmup_steps: int) -> BurstRequest:
        """This request with its defaults taken: a length (``DEFAULT_STEPS``) and ``warmup_steps`` when unset."""
        steps = DEFAULT_STEPS if self.steps is None and self.seconds is None else self.steps
        options = dataclasses.replace(self.options, warmup_steps=self.options.warmup_steps or warmup_steps)
        return dataclasses.replace(self, steps=steps, options=options)


class BurstRequestError(ValueError):
    """A burst's length or one of its :class:`BurstOptions` is unusable (not a usable number, an unknown part or
    isolation); raised when the value is made, before any process starts, because a NaN length or timeout would
    otherwise run into the timeout and read as a hang."""


def check_burst_request(steps: object, seconds: object, warmup_steps: object, timeout_s: object,
                        profile_steps: object) -> None:
    """Raise :class:`BurstRequestError` unless every burst argument is a number the engine can act on, naming every
    problem at once (the CLI and the sweep check their arguments before their first line of output).

    ``steps`` is an int >= 1 and ``seconds`` a finite number > 0, at most one of them given (neither:
    ``run_burst`` picks the default length; both would leave it to whichever ends first, a length nobody
    asked for); ``warmup_steps`` (None: the engine's default) an int >= 1, since the first step always
    pays one-off costs; ``timeout_s`` a finite number > 0; ``profile_steps`` an int >= 0. Bools are refused
    as counts, and so are floats: ``steps=2.5`` would otherwise run 3 steps.
    """
    _raise_for([*_length_problems(steps, seconds), *_option_problems(warmup_steps, timeout_s, profile_steps)])


def _raise_for(problems: list[str]) -> None:
    """Raise one :class:`BurstRequestError` naming every problem found ("" is none)."""
    found = [problem for problem in problems if problem]
    if found:
        raise BurstRequestError("; ".join(found))


def _length_problems(steps: object, seconds: object) -> list[str]:
    return [_count_problem("steps", steps, 1, optional=True), _duration_problem("seconds", seconds, optional=True),
            _both_lengths_problem(steps, seconds)]


def _option_problems(warmup_steps: object, timeout_s: object, profile_steps: object) -> list[str]:
    return [_count_problem("warmup_steps", warmup_steps, 1, optional=True,
                           why=": the first step always pays one-off costs"),
            _duration_problem("timeout_s", timeout_s, optional=False),
            _count_problem("profile_steps", profile_steps, 0, optional=False)]


def _freed_problem(freed: object) -> str:
    if freed is None or freed in PARTS:
        return ""
    return (f"freed={freed!r} names no part of the step: use one of {', '.join(map(repr, PARTS))}, or None for the "
            "config as it is")


def _choice_problem(name: str, value: object, choices: tuple[str, ...]) -> str:
    """What is wrong with a value that must be one of ``choices``, or "" when it is."""
    if value in choices:
        return ""
    named = [repr(choice) for choice in choices]
    return f"{name}={value!r} is invalid: use {', '.join(named[:-1])} or {named[-1]}"


def _cluster_problem(options: BurstOptions) -> str:
    if options.cluster is None:
        return ""
    if not isinstance(options.cluster, RayCluster):
        return f"cluster={options.cluster!r} is invalid: use accel_widgets.RayCluster(address=...), or None"
    if options.isolation != "process":
        return "cluster= runs the ranks as Ray actors: isolation='inprocess' cannot go with it"
    return ""


def _address_problem(address: object) -> str:
    if isinstance(address, str) and address.strip() and (address == "auto" or ":" in address):
        return ""
    return (f"address={address!r} is invalid: use 'auto', 'ray://host:port' (Ray Client) or a cluster's GCS "
            "'host:port'")


def _resource_problem(name: str, value: object, *, minimum: float) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        return f"{name}={value!r} is invalid: use a finite number, {name} >= {minimum:g}"
    return ""


def _count_problem(name: str, value: object, minimum: int, *, optional: bool, why: str = "") -> str:
    """What is wrong with a step count, or "" when it is an int >= ``minimum`` (or None where allowed)."""
    if value is None and optional:
        return ""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return f"{name}={value!r} is invalid: use an integer, {name} >= {minimum}{why}"
    return ""


def _both_lengths_problem(steps: object, seconds: object) -> str:
    """What is wrong with giving both lengths, or "" when at most one is given."""
    if steps is None or seconds is None:
        return ""
    return (f"steps={steps!r} and seconds={seconds!r} given together: a burst measures either a number of steps "
            "or a time; pass one of them")


def _duration_problem(name: str, value: object, *, optional: bool) -> str:
    """What is wrong with a duration in seconds, or "" when it is a finite number > 0 (or None where allowed)."""
    if value is None and optional:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return f"{name}={value!r} is invalid: use a finite number of seconds, {name} > 0"
    return ""
