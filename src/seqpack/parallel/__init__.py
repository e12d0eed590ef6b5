"""Context and data parallelism for packed rows.

* one pad multiple: :func:`compute_pad_multiple` (re-exported from :mod:`seqpack.padding`, the single
  source of truth) and :func:`check_divisibility`;
* context parallelism: :func:`cp_partition_indices`, :func:`slice_for_cp`, :func:`gather_from_cp`
  (per-segment zigzag as in Transformer Engine's THD partitioning), :func:`validate_cp_attention`;
* data parallelism (:mod:`seqpack.parallel.balance`): :func:`balance_samples` (pack + schedule samples so
  every step's DP ranks get even tokens and attention cost), :func:`balance_batch` (in-batch),
  :func:`balance_packs` (fixed packs);
* a torch batch sampler yielding each rank's balanced micro-batches:
  :class:`~seqpack.parallel.sampler.BalancedBatchSampler` (imported on first use);
* reference attention (torch): :mod:`seqpack.parallel.attention`, :mod:`seqpack.parallel.reference`.

Importing this package needs numpy and numba only; the sampler and the attention reference need torch.
"""

from seqpack.padding import compute_pad_multiple, round_up  # noqa: F401  (re-export, not reimplemented)
from seqpack.parallel.balance import (  # noqa: F401
    BalancePlan,
    SampleBalancePlan,
    attention_cost,
    balance_batch,
    balance_packs,
    balance_samples,
    cost_ratio_lower_bound,
    round_robin_plan,
)
from seqpack.parallel.cp import (  # noqa: F401
    CP_BOUNDARY_AWARE_BACKENDS,
    CP_BOUNDARY_BLIND_BACKENDS,
    PER_TOKEN_FIELDS,
    CPConfigError,
    check_divisibility,
    cp_local_cu_seqlens_padded,
    cp_partition_indices,
    gather_from_cp,
    slice_for_cp,
    validate_cp_attention,
)

__all__ = [
    "compute_pad_multiple",
    "round_up",
    "check_divisibility",
    "cp_partition_indices",
    "cp_local_cu_seqlens_padded",
    "slice_for_cp",
    "gather_from_cp",
    "validate_cp_attention",
    "CPConfigError",
    "CP_BOUNDARY_AWARE_BACKENDS",
    "CP_BOUNDARY_BLIND_BACKENDS",
    "PER_TOKEN_FIELDS",
    "BalancePlan",
    "attention_cost",
    "balance_packs",
    "balance_samples",
    "balance_batch",
    "SampleBalancePlan",
    "cost_ratio_lower_bound",
    "round_robin_plan",
    "BalancedBatchSampler",
]


def __getattr__(name):
    if name == "BalancedBatchSampler":  # torch only on first use
        from seqpack.parallel.sampler import BalancedBatchSampler

        return BalancedBatchSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
