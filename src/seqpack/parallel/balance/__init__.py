"""Data-parallel work balance for packed rows: even tokens AND even attention cost per DP rank per step.

Method, limits and trade-offs: docs/notes/balance.md. Read top-down:

* :mod:`~seqpack.parallel.balance.cost`: :func:`attention_cost`, :func:`pack_costs`,
  :func:`cost_ratio_lower_bound` (the cost model and the step score);
* :mod:`~seqpack.parallel.balance.schedule`: :class:`BalancePlan`, :class:`SampleBalancePlan`,
  :data:`FILLER` (what a plan is);
* :mod:`~seqpack.parallel.balance.packs`: :func:`balance_packs` over fixed packs (local search in
  :mod:`~seqpack.parallel.balance.search`), :func:`round_robin_plan` (the unbalanced baseline);
* :mod:`~seqpack.parallel.balance.samples`: :func:`balance_samples` (pack + balance a data set) and
  :func:`balance_batch` (one global batch), leveled sample by sample in
  :mod:`~seqpack.parallel.balance.leveling` (numba kernels in ``_kernels``).
"""

from seqpack.parallel.balance.cost import attention_cost, cost_ratio_lower_bound, pack_costs
from seqpack.parallel.balance.packs import balance_packs, round_robin_plan
from seqpack.parallel.balance.samples import balance_batch, balance_samples
from seqpack.parallel.balance.schedule import FILLER, BalancePlan, SampleBalancePlan  # noqa: F401  (FILLER: public)

__all__ = [
    "BalancePlan",
    "SampleBalancePlan",
    "attention_cost",
    "pack_costs",
    "balance_packs",
    "balance_samples",
    "balance_batch",
    "cost_ratio_lower_bound",
    "round_robin_plan",
]
