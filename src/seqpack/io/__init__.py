"""Offline packed datasets: atomic Parquet writer, memory-mapped reader, metadata and fingerprints.

Public API:
    write_packed, PackedWriter   -- write packs atomically (temp dir, fsync, rename; metadata last)
    load_packed, PackedDataset   -- map-style dataset of PackedSequence, with ``expect=`` staleness check,
                                    ``verify=`` shard sha256 check, ``load_media=`` pixel recomputation
                                    for image-text packs (per-pack ``media`` column: paths + grids)
    PackedMetadata, ShardInfo    -- ``metadata.json`` contents
    is_packed_dataset            -- whether a folder is a packed dataset (it holds ``metadata.json``)
    compute_fingerprint, describe_input, sha256_file    -- content hashes
    PackedDatasetError, StalePackedDatasetError         -- errors
    lock_output, OutputBusyError -- one run at a time per output folder (seqpack.io.output_lock)
"""

from seqpack.io.fingerprint import compute_fingerprint, describe_input, sha256_file
from seqpack.io.metadata import (
    FORMAT_VERSION,
    METADATA_FILE,
    REPORT_FILE,
    PackedDatasetError,
    PackedMetadata,
    ShardInfo,
    StalePackedDatasetError,
    is_packed_dataset,
)
from seqpack.io.reader import EXPECT_KEYS, MEDIA_EXPECT_KEYS, PackedDataset, load_packed
from seqpack.io.output_dir import check_output_dir, check_output_file
from seqpack.io.output_lock import OutputBusyError, lock_output
from seqpack.io.writer import COLUMNS, SCHEMA, PackedWriter, write_packed

__all__ = [
    "COLUMNS",
    "EXPECT_KEYS",
    "FORMAT_VERSION",
    "MEDIA_EXPECT_KEYS",
    "METADATA_FILE",
    "OutputBusyError",
    "REPORT_FILE",
    "SCHEMA",
    "PackedDataset",
    "PackedDatasetError",
    "PackedMetadata",
    "PackedWriter",
    "ShardInfo",
    "StalePackedDatasetError",
    "check_output_dir",
    "check_output_file",
    "compute_fingerprint",
    "describe_input",
    "is_packed_dataset",
    "load_packed",
    "lock_output",
    "sha256_file",
    "write_packed",
]
