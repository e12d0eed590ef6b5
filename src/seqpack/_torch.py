"""The one message for a missing PyTorch, and the guard that raises it around torch imports.

Packing, data preparation and the offline format run without torch; the collators, adapters, HF/loss
helpers, streaming packer and ``PackedSequence.to_torch`` need it. This module never imports torch at
module level, so the light floors and the CLI can import it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: The install command for the ``[torch]`` extra (pyproject.toml), in every "needs PyTorch" message.
TORCH_FIX = 'pip install -e ".[torch]" (or pip install "seqpack[torch]")'


def missing_torch_message(feature: str) -> str:
    """The message for ``feature`` run without torch: what needs it and the install command.

    Args:
        feature: what the user asked for, e.g. ``"seqpack train"`` or ``"seqpack.collate (the collators)"``.

    Returns:
        ``"<feature> needs PyTorch, which is not installed. Fix: pip install -e ".[torch]" (or ...)"``.

    Example:
        >>> missing_torch_message("seqpack.loss").startswith("seqpack.loss needs PyTorch, which is not installed.")
        True
    """
    return f"{feature} needs PyTorch, which is not installed. Fix: {TORCH_FIX}"


@contextmanager
def torch_hint(feature: str) -> Iterator[None]:
    """Wrap torch imports: a missing torch becomes one ModuleNotFoundError naming ``feature`` and the fix.

    Only the case "torch itself cannot be found" is rewritten: ``e.name == "torch"`` (also what
    ``import torch.nn.functional`` raises without torch), or a ``torch.*`` name while
    ``sys.modules["torch"]`` is ``None`` (the usual way to hide torch). An ImportError raised while an
    installed torch imports itself (a broken build, a missing shared library or dependency, a torch
    submodule this build lacks) passes through unchanged, so its real cause stays visible.

    Args:
        feature: the seqpack module or function that needs torch, as the user would name it.

    Raises:
        ModuleNotFoundError: torch is not installed; ``name == "torch"``, the message is
            :func:`missing_torch_message` of ``feature``, the original error is its ``__cause__``.

    Example:
        >>> with torch_hint("seqpack.loss"):
        ...     import torch  # doctest: +SKIP
    """
    try:
        yield
    except ModuleNotFoundError as e:
        if not _torch_absent(e.name):
            raise
        raise ModuleNotFoundError(missing_torch_message(feature), name="torch") from e


def _torch_absent(name: str | None) -> bool:
    """Whether a ModuleNotFoundError for ``name`` means "torch is not installed" (or blocked).

    ``import torch.x`` without torch fails on ``torch`` itself. With torch blocked by the
    ``sys.modules["torch"] = None`` sentinel it fails on ``torch.x`` instead; a torch that is half
    imported or broken is never in ``sys.modules`` as ``None``, so its errors stay as they are.
    """
    if name == "torch":
        return True
    return bool(name) and name.startswith("torch.") and "torch" in sys.modules and sys.modules["torch"] is None
