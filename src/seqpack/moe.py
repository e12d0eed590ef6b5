"""MoE router statistics that exclude padding slots (``padding_mask`` True = pad, Megatron-Core polarity).

Alignment padding inside a packed row (and the tail) goes through the router like any token; if
it is counted, expert loads and the load-balancing loss depend on how the data was packed
(case B17's "padding counted as real tokens"). These helpers drop padded slots first, so a packed
row gives the same statistics as its samples run one by one.
"""

from __future__ import annotations


import torch

__all__ = ["router_token_counts", "load_balancing_loss"]


def _flatten_router(router, padding_mask):
    """Concatenate per-layer router tensors ``[N, *]`` and tile the mask per layer."""
    layers = list(router) if isinstance(router, (list, tuple)) else [router]
    layers = [r.reshape(-1, r.shape[-1]) for r in layers]
    n = layers[0].shape[0]
    if padding_mask is None:
        keep = torch.ones(n, dtype=torch.bool, device=layers[0].device)
    else:
        keep = ~torch.as_tensor(padding_mask).reshape(-1).to(torch.bool).to(layers[0].device)
        if keep.numel() != n:
            raise ValueError(
                f"padding_mask has {keep.numel()} slots but the router saw {n} tokens per layer; pass the "
                "padding_mask of the same (flattened) batch"
            )
    return layers, keep


def router_token_counts(router_logits_or_topk, padding_mask, num_experts: int, top_k: int) -> torch.Tensor:
    """Tokens routed to each expert, padding excluded.

    Args:
        router_logits_or_topk: float router logits ``[N, E]`` (top-k taken here) or int expert
            indices ``[N, k]``; or a tuple/list of those, one per MoE layer (HF
            ``outputs.router_logits``), all over the same ``N`` tokens (``N = B*T`` flattened).
        padding_mask: bool ``[N]`` / ``[B, T]``, True = padding, or None (nothing excluded).
        num_experts: E.
        top_k: experts per token (ignored for int indices, which carry k).

    Returns:
        int64 ``[E]`` (one layer) or ``[L, E]`` (several layers): (token, slot) assignments per expert.

    Raises:
        ValueError: mask length differs from the router's token count.
    """
    layers, keep = _flatten_router(router_logits_or_topk, padding_mask)
    out = []
    for r in layers:
        idx = r if not r.is_floating_point() else torch.topk(r.float(), top_k, dim=-1).indices
        idx = idx[keep].reshape(-1).long()
        out.append(torch.bincount(idx, minlength=num_experts)[:num_experts])
    return out[0] if not isinstance(router_logits_or_topk, (list, tuple)) else torch.stack(out)


def load_balancing_loss(router_logits, padding_mask, num_experts: int, top_k: int) -> torch.Tensor:
    """Switch-Transformer / Mixtral load-balancing loss over real tokens only.

    ``E * sum_e f_e * P_e`` where, over the real (non-padding) tokens of all layers,
    ``f_e`` = fraction of tokens whose top-k includes expert ``e`` (per top-k slot, as in HF
    ``load_balancing_loss_func``) and ``P_e`` = mean router probability of ``e``. Equal to HF's
    ``load_balancing_loss_func(router_logits, E, k, attention_mask)`` when ``attention_mask`` marks
    the same real tokens (so not multiplied by ``router_aux_loss_coef``).

    Args:
        router_logits: float ``[N, E]`` or a tuple/list of per-layer ``[N, E]`` (HF ``outputs.router_logits``).
        padding_mask: bool ``[N]`` / ``[B, T]``, True = padding, or None.
        num_experts: E.
        top_k: k.

    Returns:
        fp32 scalar.
    """
    layers, keep = _flatten_router(router_logits, padding_mask)
    logits = torch.cat([r[keep] for r in layers], dim=0).float()
    probs = torch.softmax(logits, dim=-1)
    sel = torch.topk(probs, top_k, dim=-1).indices
    expert_mask = torch.nn.functional.one_hot(sel, num_experts).float()  # [n, k, E]
    tokens_per_expert = expert_mask.mean(dim=0)  # [k, E]
    prob_per_expert = probs.mean(dim=0)  # [E]
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * num_experts
