"""argparse ``type=`` validators shared by the standalone benchmarks (``python -m seqpack_bench.bench_<name>``).

A bad value makes argparse exit with code 2 and one line naming the option, e.g.
``bench_algorithms.py: error: argument --n: must be an integer >= 1, got '0'``, before any work starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type=``: parse a base-10 integer (``_`` separators allowed) that is ``>= minimum``.

    Raises:
        argparse.ArgumentTypeError: not an integer, or below ``minimum`` (argparse prefixes the option name).
    """

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"  # argparse shows this name in some messages
    return parse


#: ``type=positive_int``: an integer >= 1 (counts, sizes, repeats).
positive_int = int_at_least(1)


def comma_choices(choices: Iterable[str], *, allow_all: bool = True) -> Callable[[str], list[str] | None]:
    """An argparse ``type=``: a comma list of names from ``choices`` (order kept, duplicates dropped).

    Returns ``None`` for ``"all"`` when ``allow_all`` (= every choice, the caller's default order).

    Raises:
        argparse.ArgumentTypeError: an empty list or entry, or a name not in ``choices`` (the message lists them).
    """
    valid = list(choices)

    def parse(text: str) -> list[str] | None:
        if allow_all and text.strip() == "all":
            return None
        names = [s.strip() for s in text.split(",")]
        bad = [s for s in names if s and s not in valid]
        if bad or "" in names:
            what = f"unknown name(s) {', '.join(map(repr, bad))}" if bad else f"empty entry in {text!r}"
            raise argparse.ArgumentTypeError(
                f"{what}; give a comma list of {', '.join(valid)}" + (" (or 'all')" if allow_all else ""))
        return list(dict.fromkeys(names))

    parse.__name__ = "comma list"
    return parse
