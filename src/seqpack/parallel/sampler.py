"""A torch batch sampler over :func:`~seqpack.parallel.balance.balance_samples`: balanced DP steps from a DataLoader.

The only module of :mod:`seqpack.parallel` that imports torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from seqpack._torch import torch_hint

with torch_hint("seqpack.parallel.BalancedBatchSampler"):
    import torch.distributed as dist
    from torch.utils.data import Sampler

from seqpack.parallel.balance import balance_samples
from seqpack.parallel.balance.schedule import FILLER


class BalancedBatchSampler(Sampler[list[int]]):
    """Yields this DP rank's micro-batches (lists of sample indices), step after step, from a plan of
    :func:`~seqpack.parallel.balance.balance_samples` over the whole data set.

    Every rank builds the same plan (same lengths, seed and epoch) and takes its own row of each
    step, so in every step the ranks hold even tokens and attention cost, every sample is in exactly
    one micro-batch of one rank per epoch, and every rank yields the same number of micro-batches
    (``micro_batches`` per step; the last step may have fewer). A micro-batch is one pack of at most
    ``capacity`` (padded) tokens: collate it as one packed row. An empty list is a filler (only when
    there are fewer samples than micro-batch slots).

    Example (one process; under ``torchrun`` rank and world size come from ``torch.distributed``)::

        >>> import numpy as np
        >>> from seqpack.parallel.sampler import BalancedBatchSampler
        >>> lengths = np.random.default_rng(0).integers(20, 900, 400)
        >>> sampler = BalancedBatchSampler(lengths, capacity=2048, micro_batches=2, rank=0, world_size=2)
        >>> sampler.set_epoch(0)
        >>> batches = list(sampler)  # or DataLoader(dataset, batch_sampler=sampler, collate_fn=...)
        >>> len(batches) == len(sampler) == 2 * sampler.num_steps
        True
        >>> all(int(lengths[b].sum()) <= 2048 for b in batches)
        True

    Resume mid-epoch: save ``sampler.state_dict()`` with the checkpoint, and after restart call
    ``load_state_dict`` (and ``set_epoch`` with the same epoch, if you call it) before iterating; the
    remaining micro-batches are the same as in the interrupted run.

    Args:
        lengths: int [n] sample lengths in tokens, or an object with a ``lengths`` attribute (e.g. a
            packed data set's per-sample lengths).
        capacity: tokens per micro-batch (packed row length).
        micro_batches: micro-batches per rank per optimizer step (gradient accumulation).
        rank, world_size: this DP rank and the DP world size; None = from ``torch.distributed`` when
            it is initialised, else 0 and 1.
        seed: plan seed; epoch ``e`` uses ``seed + e`` (packing, step order).
        pad_to_multiple_of: segment pad multiple (see :func:`balance_samples`).
        **balance_kwargs: further options of :func:`balance_samples` (e.g. ``token_tolerance``).
    """

    def __init__(self, lengths, capacity: int, micro_batches: int = 1, *, rank: int | None = None,
                 world_size: int | None = None, seed: int = 0, pad_to_multiple_of: int = 1, **balance_kwargs):
        lengths = getattr(lengths, "lengths", lengths)
        self.lengths = np.asarray(lengths)
        if world_size is None:
            world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.rank, self.world_size = int(rank), int(world_size)
        self.capacity, self.micro_batches = int(capacity), int(micro_batches)
        self.seed, self.pad_to_multiple_of = int(seed), int(pad_to_multiple_of)
        self.balance_kwargs = balance_kwargs
        self.epoch = 0
        self._start = 0  # micro-batches of this epoch already yielded (resume point)
        self._plan = None
        self._plan_epoch = None

    def set_epoch(self, epoch: int) -> None:
        """Use the plan of ``epoch`` (seed ``seed + epoch``) from the next iteration on."""
        if int(epoch) != self.epoch:
            self._start = 0
        self.epoch = int(epoch)

    @property
    def plan(self):
        """The :class:`~seqpack.parallel.balance.SampleBalancePlan` of the current epoch (built once per epoch)."""
        if self._plan_epoch != self.epoch:
            self._plan = balance_samples(self.lengths, self.capacity, self.world_size, self.micro_batches,
                                         pad_to_multiple_of=self.pad_to_multiple_of, seed=self.seed + self.epoch,
                                         **self.balance_kwargs)
            self._plan_epoch = self.epoch
        return self._plan

    @property
    def num_steps(self) -> int:
        """Optimizer steps per epoch (the same on every rank)."""
        return self.plan.num_steps

    def _batches(self) -> list[list[int]]:
        plan = self.plan
        return [plan.bins[int(b)].tolist() if b != FILLER else [] for grid in plan.schedule.steps
                for b in grid[self.rank]]

    def __len__(self) -> int:
        return sum(int(g.shape[1]) for g in self.plan.schedule.steps)

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._batches()
        start, self._start = self._start, 0
        for k in range(start, len(batches)):
            self._yielded = k + 1
            yield batches[k]
        self._yielded = 0

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Epoch, seed and the micro-batches of this epoch done: ``consumed`` when given (what the training
        loop has used; a DataLoader fetches ahead of it), else what the iterator has yielded so far."""
        done = int(getattr(self, "_yielded", self._start)) if consumed is None else int(consumed)
        return {"epoch": self.epoch, "seed": self.seed, "yielded": done, "world_size": self.world_size,
                "rank": self.rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration starts after the micro-batches ``state`` counts as yielded."""
        if int(state["world_size"]) != self.world_size:
            raise ValueError(f"state was saved with world_size={state['world_size']}, this sampler has "
                             f"{self.world_size}; a plan is only the same on the same world size")
        self.epoch, self.seed = int(state["epoch"]), int(state["seed"])
        self._start = int(state["yielded"])
        self._yielded = self._start
