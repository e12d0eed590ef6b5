"""`seqpack validate`, `seqpack recipe` (OWNER: config helper)."""
from seqpack.cli.app import app  # noqa: F401
