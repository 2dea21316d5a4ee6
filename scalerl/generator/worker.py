"""The vLLM worker extension: joins the weight-sync group and reloads received weights in place.

vLLM mixes this class into its worker (`worker_extension_cls`), so its methods run in the process
that holds the model and are reached from the driver with `AsyncLLM.collective_rpc(name, ...)`.
Arguments and results cross a process boundary as plain data, which is why tensors travel over the
sync group and only scalars go through the RPC.

The worker already owns vLLM's default torch.distributed group (a world of one), so the sync
group is a separate process-group object built by `scalerl.sync.connect`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scalerl.errors import WeightSyncError
from scalerl.generator import cpu_lora
from scalerl.generator.adapters import write_adapter
from scalerl.rollout.keys import GENERATOR_FILES, StreamKeys
from scalerl.spec import LoraSpec
from scalerl.sync import SyncGroup, WeightReceiver, connect

log = logging.getLogger("scalerl.generator.worker")

# vLLM imports this module in the process that runs the model (`worker_extension_cls`), before
# the first forward pass: where its CPU LoRA ops are replaced by the grouped ones.
cpu_lora.install()


class WeightSyncExtension:
    """Methods added to vLLM's worker; `self` is the worker (it has `reload_weights`)."""

    # Prefixed so they cannot collide with the worker's own attributes.
    _scalerl_group: SyncGroup | None = None

    def init_weight_sync(
        self,
        host: str,
        port: int,
        world_size: int,
        rank: int,
        timeout_s: float,
        join_timeout_s: float | None = None,
        keys_dir: str | None = None,
        generation: int = 0,
    ) -> None:
        """Join `generation` of the sync group as receiver `rank` (leaving the one it was in),
        with the run's keys from `keys_dir` where it has them."""
        self.close_weight_sync()
        keys = StreamKeys.load(Path(keys_dir), GENERATOR_FILES) if keys_dir else None
        self._scalerl_group = connect(
            host,
            port,
            world_size,
            rank,
            timeout_s=timeout_s,
            join_timeout_s=join_timeout_s,
            keys=keys,
            generation=generation,
        )
        log.info(
            "joined generation %d of the weight-sync group %s:%d as rank %d of %d",
            generation, host, port, rank, world_size,
        )  # fmt: skip

    def receive_weights(self, timeout_s: float, expected_version: int | None = None) -> int:
        """Receive one whole policy version and load it into the model; return its version.

        Nothing is loaded unless the version arrived intact (the receiver checks every bucket)
        and is the one the driver expects, so on any WeightSyncError the old weights stay.
        """
        group = self._scalerl_group
        if group is None:
            raise WeightSyncError("receive_weights called before init_weight_sync")
        version, named = WeightReceiver(group).receive(timeout_s=timeout_s)
        if expected_version is not None and version != expected_version:
            raise WeightSyncError(
                f"the trainer sent version {version} but version {expected_version} was "
                "announced; keeping the previous weights"
            )
        self.load_weights_in_memory(named)
        return version

    def receive_adapter(
        self,
        timeout_s: float,
        expected_version: int,
        folder: str,
        rank: int,
        alpha: int,
        dropout: float,
        base: str,
    ) -> int:
        """LoRA: receive one version's adapter and write it as an adapter folder at `folder`,
        which the driver then loads into the adapter slot; return its version. As with
        `receive_weights`, nothing is written unless the version arrived intact."""
        group = self._scalerl_group
        if group is None:
            raise WeightSyncError("receive_adapter called before init_weight_sync")
        version, named = WeightReceiver(group).receive(timeout_s=timeout_s)
        if version != expected_version:
            raise WeightSyncError(
                f"the trainer sent version {version} but version {expected_version} was "
                "announced; keeping the previous adapter"
            )
        lora = LoraSpec(rank=rank, alpha=alpha, dropout=dropout)
        write_adapter(Path(folder), named, lora, base)
        return version

    def load_weights_in_memory(self, named: Iterable[tuple[str, Any]]) -> None:
        """Load `(name, tensor)` pairs in place: received ones, or in the colocated mode the
        trainer's own, handed over in this process."""
        # HF checkpoint names; vLLM fuses q/k/v and gate/up itself. `reload_weights` is the
        # worker's wrapper that sets the vLLM config context (plain `load_weights` fails on CPU).
        worker: Any = self
        worker.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)

    def close_weight_sync(self) -> None:
        """Leave the sync group, if joined; safe to call twice."""
        if self._scalerl_group is not None:
            self._scalerl_group.close()
            self._scalerl_group = None
