"""``datasets`` inputs on disk: a ``Dataset.save_to_disk`` folder and ``.arrow`` files, read with datasets'
own loaders (``load_from_disk``, ``Dataset.from_file``) and packed like the same records from JSONL."""

from __future__ import annotations

import json

import pytest

datasets = pytest.importorskip("datasets")

from seqpack.data.formats import normalize_record
from seqpack.data.records import DataFormatError
from seqpack.data.sources import expand_inputs, iter_records

RECORDS = [
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}]},
    {"messages": [{"role": "user", "content": "Colour?"}, {"role": "assistant", "content": "Blue."}]},
]


@pytest.fixture()
def saved(tmp_path):
    ds = datasets.Dataset.from_list(RECORDS)
    ds.save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "chat.jsonl").write_text("\n".join(map(json.dumps, RECORDS)))
    return tmp_path


def _messages(item):
    return [normalize_record(r).messages for r in iter_records(item)]


def test_save_to_disk_folder_and_arrow_file_read_like_jsonl(saved):
    want = _messages(expand_inputs(saved / "chat.jsonl")[0])
    (folder,) = expand_inputs(saved / "saved")
    assert _messages(folder) == want
    arrows = sorted((saved / "saved").glob("*.arrow"))
    assert len(arrows) == 1
    (arrow,) = expand_inputs(str(saved / "saved" / "*.arrow"))
    assert _messages(arrow) == want
    assert [r.source for r in iter_records(arrow)] == [str(arrows[0])] * 3


def test_pack_dataset_on_saved_folder_equals_jsonl(saved, tmp_path):
    from seqpack.io import load_packed
    from seqpack.pipeline import pack_dataset

    a = pack_dataset(saved / "chat.jsonl", tmp_path / "a", seq_length=256)
    b = pack_dataset(saved / "saved", tmp_path / "b", seq_length=256)
    pa, pb = load_packed(a.output), load_packed(b.output)
    assert len(pa) == len(pb) >= 1
    for x, y in zip(pa, pb):
        assert x.input_ids.tolist() == y.input_ids.tolist() and x.labels.tolist() == y.labels.tolist()
    assert [s.split(":")[0] for p in pb for s in p.sample_ids] == ["saved"] * 3


def test_bad_folders_and_arrow_files_name_the_path(saved):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(RECORDS)})
    dd.save_to_disk(str(saved / "dd"))
    with pytest.raises(DataFormatError, match=r"DatasetDict saved with save_to_disk \(splits \['train'\]\).*dd/train"):
        expand_inputs(saved / "dd")
    (saved / "plain").mkdir()
    with pytest.raises(DataFormatError, match="not a datasets save_to_disk folder"):
        expand_inputs(saved / "plain")
    bad = saved / "bad.arrow"
    bad.write_bytes(b"not arrow at all")
    with pytest.raises(DataFormatError, match=f"{bad}: cannot be read as an Arrow stream file written by datasets"):
        list(iter_records(expand_inputs(bad)[0]))
