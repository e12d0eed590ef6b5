"""Real-token gather/scatter by mask, never by prefix length (case B18)."""

from __future__ import annotations

from seqpack._torch import torch_hint

__all__ = ["real_token_indices", "segments_from_doc_ids", "gather_real", "scatter_real"]


def real_token_indices(padding_mask):
    """Indices of the real (non-padding) slots of a row, in order.

    Args:
        padding_mask: bool ``[T]`` or ``[1, T]``, True = padding. Padding may sit *between* segments
            (alignment padding), so the real tokens are found by the mask, never as ``arange(n_real)``.

    Returns:
        int64 ``[R]``.
    """
    with torch_hint("seqpack.adapters.tokens.real_token_indices()"):
        import torch

    pad = torch.as_tensor(padding_mask).reshape(-1).to(torch.bool)
    return torch.nonzero(~pad).reshape(-1)


def segments_from_doc_ids(doc_ids, pad_id: int = 0):
    """Real indices and segment lengths from a document-id layout (LLaMA-Factory neat-packing style).

    Example (B18): ``[1,1,1,0,2,2,0,0]`` -> indices ``[0,1,2,4,5]``, lengths ``[3,2]``.

    Args:
        doc_ids: int ``[T]``; ``pad_id`` marks padding, any other value a document; a new segment
            starts wherever the id changes between real slots.
        pad_id: the padding id (0 in that convention).

    Returns:
        ``(indices int64 [R], lengths int64 [N])``.
    """
    with torch_hint("seqpack.adapters.tokens.segments_from_doc_ids()"):
        import torch

    d = torch.as_tensor(doc_ids).reshape(-1)
    idx = torch.nonzero(d != pad_id).reshape(-1)
    if idx.numel() == 0:
        return idx, torch.zeros(0, dtype=torch.int64)
    real = d[idx]
    _, lengths = torch.unique_consecutive(real, return_counts=True)
    return idx, lengths.to(torch.int64)


def gather_real(x, padding_mask):
    """Keep the real-token slots of ``x`` (token dim = dim 0 of ``[T, ...]`` or dim 1 of ``[1, T, ...]``).

    Returns:
        ``[R, ...]`` (a copy).
    """
    with torch_hint("seqpack.adapters.tokens.gather_real()"):
        import torch

    x = torch.as_tensor(x)
    if x.dim() >= 2 and x.shape[0] == 1 and x.shape[1] == torch.as_tensor(padding_mask).numel():
        x = x[0]
    return x.index_select(0, real_token_indices(padding_mask).to(x.device))


def scatter_real(values, padding_mask, fill=0):
    """Inverse of :func:`gather_real`: place ``values [R, ...]`` at the real slots of a ``[T, ...]`` tensor.

    Raises:
        ValueError: if ``R`` differs from the number of real slots.
    """
    with torch_hint("seqpack.adapters.tokens.scatter_real()"):
        import torch

    values = torch.as_tensor(values)
    idx = real_token_indices(padding_mask).to(values.device)
    if values.shape[0] != idx.numel():
        raise ValueError(f"{values.shape[0]} values for {idx.numel()} real slots")
    out = values.new_full((torch.as_tensor(padding_mask).numel(), *values.shape[1:]), fill)
    out[idx] = values
    return out
