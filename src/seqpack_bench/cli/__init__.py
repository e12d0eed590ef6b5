"""The commands this package adds to ``seqpack``, as entry points of group ``seqpack.cli`` (pyproject.toml):

- ``bench`` -> :data:`seqpack_bench.cli.bench.bench_app`, a typer sub-app: ``seqpack bench algorithms |
  prepare | stream``;
- ``train`` -> :func:`seqpack_bench.cli.train.register`, which adds ``seqpack train`` to the app.

``seqpack.cli`` loads them when it is imported (:func:`seqpack.cli.load_plugins`). It is imported here
first, before either module: importing one of them directly then finds the host app complete, and the
host's loading of the entry points finds this package's modules importable.
``python -m seqpack_bench.bench_compare ...`` runs the same commands without installed entry points.
"""

import seqpack.cli  # noqa: F401 - the host app first (see above)
