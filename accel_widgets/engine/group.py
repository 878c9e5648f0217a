"""The process group DDP ranks join: set up in this one place for a burst's ranks and an exported script's.

A burst's ranks rendezvous in a file of the burst's private temp dir and keep gloo's and NCCL's sockets on the
loopback interface: nothing a burst opens is reachable from the network. A cluster's ranks meet at a TCP store on rank
0's node, their sockets pinned to their node's address (:mod:`.cluster`). An exported script's ranks join
torchrun's group (its ``env://`` rendezvous, across machines), or run in the one Ray Train's workers already share,
so nothing is pinned there.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import torch
import torch.distributed as dist

from ..knobs.plan import ProcessGroup

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Rendezvous:
    """Where a burst's ranks meet: the store they exchange addresses through, and the address of this rank's machine
    that gloo's and NCCL's own sockets are pinned to (loopback for a burst on the caller's machine; the node's address
    on a cluster, where the peers are elsewhere)."""

    store: dist.Store
    address: str

    @classmethod
    def in_file(cls, path: str, world_size: int) -> Rendezvous:
        """A burst on one machine: a file of its private temp dir, nothing on the network."""
        return cls(dist.FileStore(path, world_size), LOOPBACK)


def interface_of(address: str) -> str | None:
    """The name of the network interface that carries ``address`` (``lo`` for 127.0.0.1 on Linux)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    return None


@contextlib.contextmanager
def joined(group: ProcessGroup | None, rank: int, device: torch.device, *, rendezvous: Rendezvous | None,
           timeout_s: float) -> Iterator[None]:
    """Join ``group`` as ``rank`` for the duration (nothing for a run without one), and leave it together.

    ``rendezvous``: a burst's ranks meet in its store, and gloo's and NCCL's own sockets are pinned to the interface
    of its address, so nothing listens beyond it (a file store on one machine: loopback only). None: torchrun's
    ``env://`` rendezvous, which may span machines, or the group a launcher already made (Ray Train's workers): that
    one is used as it is, and left for its maker to destroy. A collective without a partner fails after
    ``timeout_s``, with a message, instead of hanging.
    """
    if group is None:
        yield
        return
    if rendezvous is None and dist.is_initialized():
        yield
        dist.barrier()
        return
    if rendezvous is not None and (interface := interface_of(rendezvous.address)) is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
        os.environ["NCCL_SOCKET_IFNAME"] = interface
    store = rendezvous.store if rendezvous is not None else None
    dist.init_process_group(group.backend, store=store, rank=rank if store is not None else -1,
                            world_size=group.world_size if store is not None else -1,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        yield
        # The group's users (a DDP model's reducer holds it) are freed now, in reference cycles too, while the
        # interpreter is whole: a gloo group freed at interpreter exit aborts the process ("terminate called without
        # an active exception"), and a torchrun peer then waits out its exit barrier.
        gc.collect()
        dist.barrier()  # leave together: a rank destroying its group while a peer still uses it can abort
    finally:
        dist.destroy_process_group()
