"""`seqpack pack`, `seqpack inspect`, `seqpack algorithms` (OWNER: io/cli helper)."""
from seqpack.cli.app import app  # noqa: F401
