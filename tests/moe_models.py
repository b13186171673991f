"""Small MoE layers with routing fixed by hand, so a test knows each expert's tokens: a list
of experts called on their tokens (index_select, index_add_), and a capacity layer that
dispatches tokens into [experts, capacity, d] slots (GShard / Switch) and runs every slot."""

import torch
from torch import nn


class Router(nn.Module):
    """Sends token i to ``assignment[i]`` (a fixed list): the routing a test chooses."""

    def __init__(self, d: int, assignment: list):
        super().__init__()
        self.proj = nn.Linear(d, 1)  # a router has weights; these do not decide anything
        self.register_buffer("assignment", torch.tensor(assignment), persistent=False)

    def forward(self, x):
        self.proj(x)
        return self.assignment


class ListMoE(nn.Module):
    """``experts``: an nn.ModuleList of Linear(d, h) + ReLU + Linear(h, d) experts, each
    called on the tokens routed to it (none: not called)."""

    def __init__(self, d: int, h: int, n: int, assignment: list):
        super().__init__()
        self.gate = Router(d, assignment)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, d)) for _ in range(n))

    def forward(self, x):
        route = self.gate(x)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            idx = (route == i).nonzero().flatten()
            if idx.numel():
                out = out.index_add(0, idx, expert(x.index_select(0, idx)))
        return out


class CapacityExperts(nn.Module):
    """Experts run on ``[num_experts, capacity, d]`` slots with one batched matmul each way."""

    def __init__(self, d: int, h: int, n: int):
        super().__init__()
        self.num_experts = n
        self.up = nn.Parameter(torch.randn(n, d, h) / d ** 0.5)
        self.down = nn.Parameter(torch.randn(n, h, d) / h ** 0.5)

    def forward(self, slots):
        return torch.bmm(torch.relu(torch.bmm(slots, self.up)), self.down)


class CapacityMoE(nn.Module):
    """Token i to ``assignment[i]``'s next free slot; tokens past ``capacity`` are dropped."""

    def __init__(self, d: int, h: int, n: int, capacity: int, assignment: list):
        super().__init__()
        self.gate = Router(d, assignment)
        self.capacity = capacity
        self.experts = CapacityExperts(d, h, n)

    def forward(self, x):
        route = self.gate(x).tolist()
        n, c = self.experts.num_experts, self.capacity
        slots = x.new_zeros(n, c, x.shape[-1])
        used = [0] * n
        placed = []
        for token, e in enumerate(route):
            if used[e] < c:
                slots[e, used[e]] = x[token]
                placed.append((token, e, used[e]))
                used[e] += 1
        done = self.experts(slots)
        out = torch.zeros_like(x)
        for token, e, s in placed:
            out[token] = done[e, s]
        return out
