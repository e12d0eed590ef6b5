"""Chat data preparation: read records, normalise them, tokenize with the chat template.

Public API::

    from seqpack.data import load_tokenizer, prepare, prepare_multimodal
    tok = load_tokenizer("qwen3")                       # embedded Qwen3 tokenizer, offline
    samples, report = prepare("data/*.jsonl", tok, seq_length=4096)
    samples, report = prepare_multimodal("mllm_demo.json", "qwen3", seq_length=4096, max_pixels=200704)

Layout: ``sources`` (reading files and datasets) -> ``formats`` (one normaliser per record format) ->
``chat_template`` (rendering + assistant-only mask) -> ``length_policy`` (the over-length policy, text
and images) -> ``prepare``; ``tokenizer`` loads tokenizers; ``media`` handles image-text samples;
the ``Sample`` / label contract is ``seqpack.sample`` (re-exported here).
"""

from .chat_template import TRAIN_ON, TemplateMarkers, encode_texts, render_conversation
from .formats import FORMATS, Conversation, DataFormatError, detect_format, normalize_record
from .length_policy import OVERLENGTH_POLICIES, OverlengthError, apply_overlength
from .prepare import prepare
from .media import prepare_multimodal
from seqpack.accounting import PrepareReport, SampleRecord
from seqpack.sample import IGNORE_INDEX, Sample, shift_labels
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
    "prepare_multimodal",
    "render_conversation",
    "shift_labels",
    "tokenizer_fingerprint",
]
