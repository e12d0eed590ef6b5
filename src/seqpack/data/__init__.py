"""Chat data preparation: read records, normalise them, tokenize with the chat template.

Public API::

    from seqpack.data import prepare, load_tokenizer
    tok = load_tokenizer("qwen3")                       # embedded Qwen3 tokenizer, offline
    samples, report = prepare("data/*.jsonl", tok, seq_length=4096)

See ``seqpack.data.formats`` (record formats), ``seqpack.data.tokenize`` (assistant-only labels,
over-length policy) and ``seqpack.data.sample`` (the ``Sample`` / label contract).
"""

from .formats import FORMATS, Conversation, DataFormatError, detect_format, normalize_record
from .prepare import prepare
from .sample import IGNORE_INDEX, PrepareReport, Sample, SampleRecord, shift_labels
from .tokenize import (
    OVERLENGTH_POLICIES,
    TRAIN_ON,
    OverlengthError,
    TemplateMarkers,
    apply_overlength,
    encode_texts,
    render_conversation,
)
from .tokenizer import TokenizerError, load_tokenizer, tokenizer_fingerprint

__all__ = [
    "FORMATS",
    "IGNORE_INDEX",
    "OVERLENGTH_POLICIES",
    "TRAIN_ON",
    "Conversation",
    "DataFormatError",
    "OverlengthError",
    "PrepareReport",
    "Sample",
    "SampleRecord",
    "TemplateMarkers",
    "TokenizerError",
    "apply_overlength",
    "detect_format",
    "encode_texts",
    "load_tokenizer",
    "normalize_record",
    "prepare",
    "render_conversation",
    "shift_labels",
    "tokenizer_fingerprint",
]
