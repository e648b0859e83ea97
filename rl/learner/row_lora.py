"""LoRA layers that give each job's rows its own adapter: a sweep pack's grouped forward (rl/learner/grouped.py) runs
every job's rows through one model, each PEFT LoRA layer adding to job j's rows B_j A_j x * scaling with job j's
factors. `StackedFactors` holds the jobs' factors stacked per layer (one leaf per layer for the step, job j at index
j), `RowAdapters` swaps the layers' forward for the grouped one while entered.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F


def lora_layers(model: Any) -> list[tuple[str, Any, str]]:
    """(name, module, its active adapter) of every PEFT LoRA layer of `model` that has one."""
    from peft.tuners.lora import LoraLayer

    return [
        (name, module, module.active_adapters[0])
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and module.active_adapters
    ]


class StackedFactors:
    """Every PEFT LoRA layer's A and B of several jobs (`factors`: one {parameter name: tensor} per job), stacked
    along a new first dimension, job j at index j. With `grad` the stacks are leaves: one gradient tensor per layer
    factor for all the jobs, job j's at index j (`grads`), each job's own since only its rows meet its slice. One
    leaf per layer rather than one per job and layer: on a GPU the grouped step is bound by its host's work per op,
    and per-job leaves cost a stack in every forward and an unbind and an accumulation per job in every backward."""

    def __init__(self, model: Any, factors: list[dict[str, torch.Tensor]], grad: bool = False):
        self.layers: list[tuple[Any, str, str, torch.Tensor, torch.Tensor]] = []
        for name, module, adapter in lora_layers(model):
            names = f"{name}.lora_A.{adapter}.weight", f"{name}.lora_B.{adapter}.weight"
            a, b = (torch.stack([f[n].detach() for f in factors]) for n in names)
            if grad:
                a, b = a.requires_grad_(), b.requires_grad_()
            self.layers.append((module, *names, a, b))

    def grads(self, job: int) -> dict[str, torch.Tensor | None]:
        """Job `job`'s gradient of each factor, by parameter name (None: no forward reached it)."""
        out: dict[str, torch.Tensor | None] = {}
        for _, name_a, name_b, a, b in self.layers:
            out[name_a] = None if a.grad is None else a.grad[job]
            out[name_b] = None if b.grad is None else b.grad[job]
        return out


class RowAdapters:
    """Every PEFT LoRA layer of `model` (Linear and the bnb 4-bit Linear) computing base(x) plus, for each job's
    rows of x, lora_B_j(lora_A_j(x_j)) * scaling with job j's factors from `stack` (StackedFactors) instead of the
    layer's own parameters. `rows(sizes, dim)`: in the next forward job j has sizes[j] consecutive rows along `dim`
    (0: the samples of padded micro-batches; 1: the tokens of a packed row; 0: none). A context manager: the
    layers' own forward is back on exit, also on error. Keep it entered through the backward: a checkpointed model
    runs the forward again there."""

    def __init__(self, stack: StackedFactors, in_input_dtype: bool = False):
        # the LoRA matmuls in the factors' dtype, the input cast to it, as PEFT's layers compute; in_input_dtype
        # (Unsloth): in the input's (bf16), the factors cast to it and B scaled before the matmul, as Unsloth's
        # fused LoRA kernels compute (tensor-core matmuls: fp32 ones cost most of a grouped step on a GPU)
        self.in_input_dtype = in_input_dtype
        self.layers = [(module, a, b) for module, _, _, a, b in stack.layers]
        self.scaling = [module.scaling[module.active_adapters[0]] for module, _, _ in self.layers]
        self.sizes: list[int] = []
        self.live: list[int] = []
        self.index: torch.Tensor | None = None
        self.dim = 0

    def rows(self, sizes: list[int], dim: int = 0) -> None:
        self.sizes, self.dim = list(sizes), dim
        self.live = [j for j, n in enumerate(sizes) if n]
        # the live jobs' slices of each stack, picked once a forward (None: every job is live, the stack itself)
        device = self.layers[0][1].device if self.layers else None
        whole = len(self.live) == len(sizes)
        self.index = None if whole else torch.tensor(self.live, dtype=torch.long, device=device)

    def __enter__(self) -> RowAdapters:
        for (module, a, b), scaling in zip(self.layers, self.scaling):
            module.forward = functools.partial(self._forward, module, a, b, scaling)
        return self

    def __exit__(self, *exc: object) -> None:
        for module, _, _ in self.layers:
            module.__dict__.pop("forward", None)

    def _live(self, stack: torch.Tensor) -> torch.Tensor:
        return stack if self.index is None else stack.index_select(0, self.index)

    def _equal_spans(self) -> bool:
        return self.dim == 0 and len({self.sizes[j] for j in self.live}) == 1

    def _forward(self, module: Any, a: torch.Tensor, b: torch.Tensor, scaling: float, x: torch.Tensor, *args, **kw):
        result = module.base_layer(x, *args, **kw)
        if module.disable_adapters:
            return result
        if sum(self.sizes) != x.shape[self.dim]:
            raise RuntimeError(f"grouped LoRA forward: {x.shape[self.dim]} rows in, the jobs have {self.sizes}")
        if self.in_input_dtype:
            return self._in_input_dtype(result, x, a, b, scaling)
        if not torch.is_autocast_enabled():  # as the LoRA layers cast: the input in the factors' dtype
            x = x.to(a.dtype)
        if len(self.live) > 1 and self._equal_spans():
            # every job the same number of samples (a sweep's usual micro-batch): two batched matmuls for all the
            # jobs instead of two per job (a GPU step is bound by its kernel launches)
            a_t, b_t = self._live(a).transpose(1, 2), self._live(b).transpose(1, 2)  # [jobs, in, r], [jobs, r, out]
            rows = x.reshape(len(self.live), -1, x.shape[-1])
            delta = (torch.bmm(torch.bmm(rows, a_t), b_t) * scaling).reshape(*x.shape[:-1], b_t.shape[-1])
        else:
            parts, start = [], 0
            for j, n in enumerate(self.sizes):
                if n:
                    parts.append(F.linear(F.linear(x.narrow(self.dim, start, n), a[j]), b[j]) * scaling)
                start += n
            delta = torch.cat(parts, dim=self.dim)
        # a new tensor (no in-place write into the base layer's output, which autograd may hold), rounded as the
        # layer itself rounds: PEFT's 4-bit layer adds the delta in its output's dtype, its Linear in the wider one
        if type(module).__module__.endswith(".bnb"):
            return result + delta.to(result.dtype)
        return (result + delta).to(result.dtype)

    def _in_input_dtype(
        self, result: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        """result + each job's x_j A_j^T (B_j^T * scaling), all in x's dtype, added to the output in one batched
        matmul where the jobs have equal spans of rows."""
        dtype = x.dtype
        if self._equal_spans():
            a_t = self._live(a).to(dtype).transpose(1, 2)  # [jobs, in, r]
            b_t = (self._live(b) * scaling).to(dtype).transpose(1, 2)  # [jobs, r, out]
            rows = x.reshape(len(self.live), -1, x.shape[-1])
            out = torch.baddbmm(result.to(dtype).reshape(len(self.live), -1, b_t.shape[-1]), torch.bmm(rows, a_t), b_t)
            return out.reshape(result.shape).to(result.dtype)
        parts, start = [], 0
        for j, n in enumerate(self.sizes):
            if n:
                xa = F.linear(x.narrow(self.dim, start, n), a[j].to(dtype))
                parts.append(F.linear(xa, (b[j] * scaling).to(dtype)))
            start += n
        return (result.to(dtype) + torch.cat(parts, dim=self.dim)).to(result.dtype)
