"""The process group DDP ranks join: set up in this one place for a burst's ranks and an exported script's.

A burst's ranks rendezvous in a file of the burst's private temp dir and keep gloo's and NCCL's sockets on the
loopback interface: nothing a burst opens is reachable from the network. An exported script's ranks join
torchrun's group (its ``env://`` rendezvous, across machines), so nothing is pinned there.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator

import psutil
import torch
import torch.distributed as dist

from ..knobs.plan import ProcessGroup

LOOPBACK = "127.0.0.1"


def _loopback_interface() -> str | None:
    """The name of the interface that carries 127.0.0.1 (``lo`` on Linux)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == LOOPBACK for a in addresses):
            return name
    return None


@contextlib.contextmanager
def joined(group: ProcessGroup | None, rank: int, device: torch.device, *, rendezvous_file: str | None,
           timeout_s: float) -> Iterator[None]:
    """Join ``group`` as ``rank`` for the duration (nothing for a run without one), and leave it together.

    ``rendezvous_file``: a burst's ranks meet in this file of its private temp dir, and gloo's and NCCL's own
    sockets are pinned to the loopback interface, so nothing is reachable from the network (a TCP store would
    listen on every interface, unauthenticated). None: torchrun's ``env://`` rendezvous, which may span machines.
    A collective without a partner fails after ``timeout_s``, with a message, instead of hanging.
    """
    if group is None:
        yield
        return
    store = None
    if rendezvous_file is not None:
        interface = _loopback_interface()
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
            os.environ["NCCL_SOCKET_IFNAME"] = interface
        store = dist.FileStore(rendezvous_file, group.world_size)
    dist.init_process_group(group.backend, store=store, rank=rank if store is not None else -1,
                            world_size=group.world_size if store is not None else -1,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        yield
        dist.barrier()  # leave together: a rank destroying its group while a peer still uses it can abort
    finally:
        dist.destroy_process_group()
