"""The Arrow allocator of a ``seqpack`` command's process.

pyarrow allocates with mimalloc by default, whose memory is mapped with transparent huge pages
(``MADV_HUGEPAGE``): each 2 MB page it touches counts whole in the resident set. Writing one Parquet row
group of long packs (e.g. a 1 MB record split into 79 packs of 4,096 tokens: two 1.3 MB list columns)
then raised the peak RSS by about 18 MB although Arrow's live buffers stay near 3 MB; with the C library's
``malloc`` the same write adds about 2 MB. The pool is chosen once, when pyarrow is first imported, from
the ``ARROW_DEFAULT_MEMORY_POOL`` environment variable (``pyarrow.set_memory_pool`` after the import
does not reach the Parquet writer's internal buffers), so the command line sets it before anything
imports pyarrow. Output bytes do not depend on the allocator.
"""

from __future__ import annotations

import os
import sys
from typing import MutableMapping

__all__ = ["ARROW_POOL_ENV", "prefer_system_allocator"]

#: the environment variable Arrow reads (once, when pyarrow is first imported) to pick its default memory pool
ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def prefer_system_allocator(environ: MutableMapping[str, str] | None = None, modules: dict | None = None) -> bool:
    """Make Arrow use the C library's ``malloc`` (``ARROW_DEFAULT_MEMORY_POOL=system``) in this process
    and the processes it starts, unless the user chose a pool (the variable is already set, even empty)
    or pyarrow is already imported (too late: its pool is fixed).

    Args:
        environ: the environment to set (default ``os.environ``).
        modules: the imported modules (default ``sys.modules``).

    Returns:
        ``True`` when the variable was set here, else ``False``.

    Example:
        >>> env = {}
        >>> prefer_system_allocator(env, modules={}), env
        (True, {'ARROW_DEFAULT_MEMORY_POOL': 'system'})
        >>> prefer_system_allocator({"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}, modules={})
        False
    """
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if ARROW_POOL_ENV in environ or "pyarrow" in modules:
        return False
    environ[ARROW_POOL_ENV] = "system"
    return True
