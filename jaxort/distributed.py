"""``jaxort.distributed``: multi-process training, re-exported from :mod:`jaxort.training.distributed`."""

from jaxort.training.distributed import (
    global_mesh,
    initialize,
    is_coordinator,
    load_checkpoint,
    local_batch,
    process_count,
    process_index,
    save_checkpoint,
    shutdown,
    sync,
)

__all__ = ["global_mesh", "initialize", "is_coordinator", "load_checkpoint", "local_batch", "process_count",
           "process_index", "save_checkpoint", "shutdown", "sync"]
