"""How a packing message reads on the command line: ``pack_dataset`` keywords become ``seqpack pack`` flags.

Every message of this package is written once, with the keywords a Python caller types
(``seq_length=4096``, ``overlength='split'``, ``media_dir=DIR``). ``seqpack pack`` shows each error through
:func:`cli_error_text`, which spells them as the flags a shell user types (``--seq-length 4096``,
``--overlength split``, ``--media-dir DIR``), or as the config file's keys when ``--config`` set the value.
"""

from __future__ import annotations

import re
from typing import Collection

from seqpack.pipeline.job import NothingToPackError, PackConfigError

__all__ = ["PACK_FLAGS", "cli_error_text", "cli_message"]

#: ``pack_dataset`` keyword -> ``seqpack pack`` flag.
PACK_FLAGS = {
    "seq_length": "--seq-length",
    "pad_to_multiple_of": "--pad-to-multiple-of",
    "context_parallel_size": "--context-parallel-size",
    "algorithm": "--algorithm",
    "overlength": "--overlength",
    "on_error": "--on-error",
    "train_on": "--train-on",
    "format": "--format",
    "seed": "--seed",
    "tokenizer": "--tokenizer",
    "num_proc": "--num-proc",
    "num_cpus": "--num-cpus",
    "planning": "--planning",
    "engine": "--engine",
    "image_processor": "--image-processor",
    "min_pixels": "--min-pixels",
    "max_pixels": "--max-pixels",
    "overwrite": "--overwrite",
    "media_dir": "--media-dir",
    "allow_any_media_path": "--allow-any-media-path",
}

#: on/off flags: ``key=True`` is the bare flag.
_SWITCHES = {"overwrite", "allow_any_media_path"}

#: keywords that are also plain words ("algorithm", "format"): translated only as ``key=value``.
_PLAIN_WORDS = {k for k in PACK_FLAGS if "_" not in k}


def cli_message(message: str, flags: dict[str, str] | None = None, *, config_keys: Collection[str] = (),
                config_source: str | None = None) -> str:
    """``message`` (written with ``pack_dataset`` keyword names) as a ``seqpack pack`` user reads it.

    ``seq_length=7`` becomes ``--seq-length 7`` and ``overlength='split'`` becomes ``--overlength split``
    (a quoted value that is one shell word loses its quotes); ``allow_any_media_path=True`` becomes
    ``--allow-any-media-path``. A keyword with an underscore (``num_proc``) is replaced wherever it stands
    as a word; a plain-word keyword (``algorithm``, ``format``) only in the ``key=value`` form, so prose
    ("unknown packing algorithm") is left alone. A keyword in ``config_keys`` (its value came from the
    ``--config`` file) keeps its name, in the file's spelling (``seq_length: 16384``), and the message
    ends by naming ``config_source`` and the flags that override those keys.

    Args:
        message: the text to translate.
        flags: keyword -> flag (default :data:`PACK_FLAGS`).
        config_keys: the keywords whose values came from the config file.
        config_source: how the user named the config (``"--config c/my.yaml"``); needed with ``config_keys``.

    Example::

        cli_message("seq_length=100 is not divisible by 8; set seq_length to 96 or overlength='drop'")
        # '--seq-length 100 is not divisible by 8; set --seq-length to 96 or --overlength drop'
        cli_message("seq_length=100 is not divisible by 8", config_keys={"seq_length"},
                    config_source="--config c.yaml")
        # 'seq_length: 100 is not divisible by 8 (seq_length comes from --config c.yaml; change it there,
        #  or override it with --seq-length)'
    """
    flags = PACK_FLAGS if flags is None else flags
    from_config: list[str] = []

    def sub(m: "re.Match[str]") -> str:
        key, eq, value = m.group(1), m.group(2), m.group(3)
        if key in _PLAIN_WORDS and not eq:
            return m.group(0)
        word = value[1:-1] if value and value.startswith("'") else value
        if key in config_keys:
            if key not in from_config:
                from_config.append(key)
            return f"{key}: {word}" if eq and word else (f"{key}: " if eq else key)
        if eq and value == "True" and key in _SWITCHES:
            return flags[key]
        return f"{flags[key]} {word}" if eq and word else flags[key] + (" " if eq else "")

    names = "|".join(sorted(map(re.escape, flags), key=len, reverse=True))
    text = re.sub(rf"(?<![\w.*-])({names})(?![\w-])(?:(=)('[\w./-]+'(?![\w'])|True\b)?)?", sub, message)
    if from_config and config_source:
        one = len(from_config) == 1
        text += (f" ({' and '.join(from_config)} {'comes' if one else 'come'} from {config_source}; change "
                 f"{'it' if one else 'them'} there, or override {'it' if one else 'them'} with "
                 f"{' / '.join(flags[k] for k in from_config)})")
    return text


def cli_error_text(exc: BaseException, *, config_keys: Collection[str] = (), config_source: str | None = None) -> str:
    """The message of an error raised by :func:`~seqpack.pipeline.pack_dataset`, for a ``seqpack pack`` user.

    A settings error (:class:`PackConfigError`, :class:`NothingToPackError`) is translated whole by
    :func:`cli_message`. Another error (a bad record, an over-length sample, a worker that died) may quote
    the record, so only its fix, the text after its last ``Fix:``, is translated. ``config_keys`` and
    ``config_source``: as :func:`cli_message`.

    Example::

        cli_error_text(OverlengthError("sample 'a:0' ... Fix: raise seq_length, or pass overlength='split'."))
        # "sample 'a:0' ... Fix: raise --seq-length, or pass --overlength split."
    """
    text = str(exc)
    kw = {"config_keys": config_keys, "config_source": config_source}
    if isinstance(exc, (PackConfigError, NothingToPackError)):
        return cli_message(text, **kw)
    head, sep, fix = text.rpartition("Fix:")
    return head + sep + cli_message(fix, **kw) if sep else text
