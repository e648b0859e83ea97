"""Data parallelism among learners: one torch.distributed group (gloo on CPU, NCCL on CUDA), rank 0 publishes.

Each learner holds a shard of whole prompt groups; normalising the loss by counts summed over all shards makes
the summed gradient equal to one learner's gradient on the whole batch, so every learner clips and steps on the
same gradient and their adapters stay identical.
"""

from __future__ import annotations

import torch


class DataParallel:
    def __init__(self, device: torch.device):
        self.device = device
        self.world_size, self.rank = 1, 0

    def init(self, address: str, port: int, world_size: int, rank: int) -> None:
        import datetime

        import torch.distributed as dist

        dist.init_process_group(
            backend="nccl" if self.device.type == "cuda" else "gloo",
            init_method=f"tcp://{address}:{port}",
            world_size=world_size,
            rank=rank,
            timeout=datetime.timedelta(minutes=10),
        )
        self.world_size, self.rank = world_size, rank

    def sum_counts(self, *counts: int) -> list[int]:
        if self.world_size == 1:
            return list(counts)
        import torch.distributed as dist

        t = torch.tensor(counts, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return [int(x) for x in t.tolist()]

    def sum_grads_and_metrics(
        self, params: list[torch.nn.Parameter], loss: float, sums: dict[str, float], n_signal: int
    ) -> tuple[float, dict[str, float]]:
        """Sum the gradients and the (globally normalised, hence additive) loss and metrics over learners.

        A learner whose shard had no signal has no gradients: it adds zeros, so every learner clips and steps
        on the same summed gradient. When no learner had signal, no gradient exists anywhere and none is made
        (the optimizer then skips every parameter, as a single learner would)."""
        import torch.distributed as dist

        if n_signal > 0:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            flat = torch.cat([p.grad.reshape(-1) for p in params])  # one collective instead of one per tensor
            dist.all_reduce(flat)
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, (loss, sums))
        total: dict[str, float] = {}
        for _, part in gathered:
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v
        return sum(x for x, _ in gathered), total

    def close(self) -> None:
        import torch.distributed as dist

        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()
