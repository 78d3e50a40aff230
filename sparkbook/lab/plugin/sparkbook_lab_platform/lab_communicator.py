"""The lab platform's device communicator: vLLM's CPU communicator, with its shared-memory
all-reduce kept within one host (see the package's docstring)."""

from __future__ import annotations

import socket

import torch
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator


class HostLocalCpuCommunicator(CpuCommunicator):
    def _all_group_ranks_share_shm_group_name(self) -> bool:
        """vLLM's test (one SHM group name across the group), and one host across the group."""
        if not super()._all_group_ranks_share_shm_group_name():
            return False
        hosts: list[str] = [""] * self.world_size
        torch.distributed.all_gather_object(hosts, socket.gethostname(), group=self.device_group)
        return len(set(hosts)) == 1
