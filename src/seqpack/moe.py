"""MoE router statistics that exclude padding slots (``padding_mask`` True = pad, Megatron-Core polarity).

Alignment padding inside a packed row (and the tail) goes through the router like any token; if
it is counted, expert loads and the load-balancing loss depend on how the data was packed
(case B17's "padding counted as real tokens"). These helpers drop padded slots first, so a packed
row gives the same statistics as its samples run one by one.
"""

from __future__ import annotations

import sys
from typing import Any

from seqpack._torch import torch_hint

with torch_hint("seqpack.moe (MoE router statistics)"):
    import torch

from seqpack.adapters.architecture import PackingUnsupportedError, mark_router_prepared

__all__ = ["router_token_counts", "load_balancing_loss", "prepare_model", "router_loss_settings"]


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


# ----------------------------------------------------------------------------- transformers models
_OFF = object()  # a forward that did not ask for router statistics


def _model_type(model) -> str:
    return str(getattr(model.config, "model_type", type(model).__name__))


def router_loss_settings(model) -> tuple[Any, int, int, float]:
    """``(load_balancing_loss_func, num_experts, top_k, router_aux_loss_coef)`` as ``model``'s own forward uses
    them: the function of the model's modeling module, and the model's ``num_experts`` /
    ``num_experts_per_tok`` / ``router_aux_loss_coef`` (``aux_loss_coef``) attributes.

    Raises:
        PackingUnsupportedError: the model has no such function or attributes (not a transformers MoE).
    """
    fn = getattr(sys.modules.get(type(model).__module__), "load_balancing_loss_func", None)
    e, k = getattr(model, "num_experts", None), getattr(model, "num_experts_per_tok", None)
    coef = getattr(model, "router_aux_loss_coef", getattr(model, "aux_loss_coef", None))
    if fn is None or not e or not k or coef is None:
        raise PackingUnsupportedError(
            _model_type(model), "moe_router",
            f"{type(model).__name__} has no load_balancing_loss_func in its modeling module or no num_experts / "
            "num_experts_per_tok / router_aux_loss_coef attributes, so seqpack cannot compute its router loss "
            "over real tokens", "run it with output_router_logits=False, or on padded batches")
    return fn, int(e), int(k), float(coef)


def _decoder(model):
    get = getattr(model, "get_decoder", None)
    dec = get() if callable(get) else None
    return dec if isinstance(dec, torch.nn.Module) and dec is not model else model.base_model


def _outer_pre(module, args, kwargs):
    state = module._seqpack_router
    pad = kwargs.pop("padding_mask", None)
    want = kwargs.get("output_router_logits")
    if want is None:
        want = bool(getattr(module.config, "output_router_logits", False))
    if not want:
        state.append(_OFF)
        return args, kwargs
    mask = kwargs.get("attention_mask")
    if pad is not None:
        real = ~torch.as_tensor(pad).to(torch.bool)
    elif isinstance(mask, torch.Tensor) and mask.dim() == 2:
        real = mask.to(torch.bool)
    elif mask is None and kwargs.get("cu_seq_lens_q") is None:
        real = None  # no padding anywhere (transformers counts every token too)
    else:
        raise PackingUnsupportedError(
            _model_type(module), "moe_router",
            "output_router_logits=True on a packed batch (4-D / per-layer attention mask or cu_seq_lens_q) that "
            "carries no padding_mask, so the router statistics cannot exclude padding",
            "build the batch with a seqpack collator (format='hf', config=model.config), which carries "
            "padding_mask, or use seqpack.hf.packed_forward")
    kwargs["output_router_logits"] = False  # the head skips transformers' aux loss; the decoder records (below)
    state.append(real)
    return args, kwargs


def _decoder_pre(owner):
    def hook(module, args, kwargs):
        state = owner._seqpack_router
        if state and state[-1] is not _OFF:
            kwargs["output_router_logits"] = True  # the decoder's own output recording (_can_record_outputs)
        return args, kwargs
    return hook


def _outer_post(module, args, kwargs, output):
    real = module._seqpack_router.pop() if module._seqpack_router else _OFF
    if real is _OFF or output is None:
        return output
    router = getattr(output, "router_logits", None)
    if not router:
        raise PackingUnsupportedError(
            _model_type(module), "moe_router", "the decoder recorded no router_logits, so seqpack cannot compute the "
            "router loss", "run it with output_router_logits=False, or on padded batches")
    fn, e, k, coef = router_loss_settings(module)
    mask = None if real is None else real.reshape(1, -1).to(torch.long) if real.dim() == 1 else real.to(torch.long)
    aux = fn(tuple(router), e, k, mask)
    output.aux_loss = aux
    if getattr(output, "loss", None) is not None:
        output.loss = output.loss + coef * aux.to(output.loss.device)
    return output


def prepare_model(model):
    """Make an HF MoE causal LM compute its router loss over real tokens on packed batches; returns ``model``.

    Installs (once) forward hooks on ``model`` and on its decoder (``model.get_decoder()``). On a call
    asking for router statistics (``output_router_logits=True``, or the config's), they

    - pop ``padding_mask`` (bool ``[B, T]``, True = pad, as seqpack's ``format="hf"`` collators and
      ``packed_forward`` pass it; a 2-D ``attention_mask`` serves when it is absent);
    - let the decoder record ``router_logits`` with its own output recording, while the model's head runs
      with ``output_router_logits=False`` (so transformers never hands the 4-D mask to its loss);
    - set ``outputs.aux_loss`` = the model module's own ``load_balancing_loss_func(router_logits,
      num_experts, top_k, attention_mask)`` with the 2-D real-token mask, i.e. what transformers computes on
      the same samples as a padded batch, and add ``router_aux_loss_coef * aux_loss`` to ``outputs.loss``
      when labels were given, as the model's forward does.

    Logits, hidden states and the model's own logit post-processing are untouched. Calls without router
    statistics pass through (``padding_mask`` is still popped). HF ``Trainer`` users call it before
    ``Trainer(...)``; ``seqpack.hf.packed_forward`` calls it itself.

    Raises:
        PackingUnsupportedError: not a transformers MoE model (:func:`router_loss_settings`).
    """
    if getattr(model, "_seqpack_router", None) is not None:
        return model
    router_loss_settings(model)
    model._seqpack_router = []
    model.register_forward_pre_hook(_outer_pre, with_kwargs=True)
    model.register_forward_hook(_outer_post, with_kwargs=True, always_call=True)
    _decoder(model).register_forward_pre_hook(_decoder_pre(model), with_kwargs=True)
    mark_router_prepared(model.config)
    return model
