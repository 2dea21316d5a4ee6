"""Weight broadcast from trainer rank 0 to every generator over torch.distributed.

`connect` builds a process group apart from the default one (gloo on CPU, NCCL on GPUs);
`WeightSender` and `WeightReceiver` move whole, checksummed policy versions over it.
"""

from scalerl.sync.group import SyncGroup, connect
from scalerl.sync.weights import SendStats, WeightReceiver, WeightSender

__all__ = ["SendStats", "SyncGroup", "WeightReceiver", "WeightSender", "connect"]
