"""Offline packing of image-text records: `seqpack.pipeline.pack_dataset`, the `media` column, `load_packed`
with `load_media=True`, and the `seqpack pack` image options."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from seqpack.cli import app
from seqpack.data.media import VisionTokens, collate_media
from seqpack.io import PackedDatasetError, load_packed, write_packed
from seqpack.pipeline import PackConfigError, pack_dataset
from _helpers import llava_record

SMALL = {"max_pixels": 64 * 28 * 28, "min_pixels": 4 * 28 * 28}  # short image runs, fast tests
runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


@pytest.fixture(scope="module")
def vt(qwen3_tokenizer):
    return VisionTokens.from_tokenizer(qwen3_tokenizer)


def _inputs(shared: Path) -> list[Path]:
    return [shared / "llama-factory" / "mllm_demo.json", *sorted((shared / "lmms-finetune").glob("*.json"))]


def _num_records(paths) -> int:
    return sum(len(json.loads(Path(p).read_text())) for p in paths)


@pytest.fixture(scope="module")
def packed_real(shared_data, qwen3_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("offline_media") / "packed"
    res = pack_dataset(_inputs(shared_data), out, tokenizer=qwen3_tokenizer, seq_length=2048,
                       pad_to_multiple_of=8, min_pixels=SMALL["min_pixels"], max_pixels=SMALL["max_pixels"])
    return res


def _runs(ids: np.ndarray, vt: VisionTokens) -> list[int]:
    """Number of <|image_pad|> in each <|vision_start|> <|image_pad|>* <|vision_end|> run (asserts the shape)."""
    out = []
    for s in np.flatnonzero(ids == vt.vision_start_id):
        e = s + 1
        while e < len(ids) and ids[e] == vt.image_pad_id:
            e += 1
        assert e < len(ids) and ids[e] == vt.vision_end_id, "image run cut or malformed"
        out.append(int(e - s - 1))
    return out


def test_offline_media_real_data_image_tokens_per_pack(packed_real, shared_data, vt, qwen3_tokenizer):
    res = packed_real
    meta = res.metadata
    ds = load_packed(res.output)
    merge = meta.media["merge_size"]
    assert merge == 2 and meta.media["max_pixels"] == SMALL["max_pixels"] and meta.media["min_pixels"] == SMALL["min_pixels"]
    assert meta.media["image_pad_id"] == vt.image_pad_id
    seen_ids: list[str] = []
    total_img_tokens = total_images = text_only_segments = 0
    for i in range(len(ds)):
        row = ds[i]
        row.validate(capacity=2048)
        seen_ids += row.sample_ids
        assert row.media is not None and len(row.media) == row.num_segments
        pack_pads = int(np.count_nonzero(row.input_ids == vt.image_pad_id))
        expected = 0
        for j, m in enumerate(row.media):
            a, L = int(row.cu_seqlens_padded[j]), int(row.cu_seqlens[j + 1] - row.cu_seqlens[j])
            seg = np.asarray(row.input_ids[a:a + L])
            assert "<image>" not in qwen3_tokenizer.decode(seg.tolist())
            if m is None:
                text_only_segments += 1
                assert not np.any(seg == vt.image_pad_id)
                continue
            grid = m["image_grid_thw"]
            per_image = np.prod(grid, axis=1) // merge**2
            assert _runs(seg, vt) == per_image.tolist()  # one whole run per image, in order
            assert m["image_tokens"].tolist() == per_image.tolist()
            assert len(m["images"]) == grid.shape[0] and all(Path(p).is_file() for p in m["images"])
            # labels never target image tokens
            assert not np.any(np.isin(np.asarray(row.labels[a:a + L]), [vt.image_pad_id]))
            expected += int(per_image.sum())
            total_images += grid.shape[0]
        assert pack_pads == expected
        total_img_tokens += expected
    # every record accounted for, none twice
    c = meta.counts
    n_records = _num_records(_inputs(shared_data))
    assert c["records_read"] == n_records
    not_packed = sum(sum(v.values()) for k, v in c.items() if k in ("dropped", "skipped"))
    assert c["samples_packed"] + not_packed == n_records
    assert len(seen_ids) == len(set(seen_ids)) == c["samples_packed"]
    assert c["image_tokens"] == total_img_tokens and c["images"] == total_images > 100
    assert text_only_segments >= 2  # single_image_has_text_only.json mixes text-only records
    # lengths include the image tokens
    assert c["tokens"] == int(ds.segment_lengths().sum()) > total_img_tokens


def test_offline_media_reload_pixels(packed_real, vt):
    ds = load_packed(packed_real.output, load_media=True)
    dim = 3 * 2 * 14 * 14
    for i in range(len(ds)):
        row = ds[i]
        grids = []
        for m in row.media:
            if m is None:
                continue
            rows = int(np.prod(m["image_grid_thw"], axis=1).sum())
            assert m["pixel_values"].shape == (rows, dim) and m["pixel_values"].dtype == np.float32
            grids.append(m["image_grid_thw"])
            assert m["mrope_position_ids"].shape == (3, len(m["mrope_position_ids"][0]))
        cm = collate_media(row.media)
        assert cm["pixel_values"].shape[0] == int(np.prod(cm["image_grid_thw"], axis=1).sum())
        assert np.array_equal(cm["image_grid_thw"], np.concatenate(grids))
        mrope = row.extra["mrope_position_ids"]
        assert mrope.shape == (3, len(row.input_ids))
        # positions restart per segment
        assert np.all(mrope[:, np.asarray(row.cu_seqlens_padded[:-1])] == 0)
    # the trainer's image processor settings are checked like the other settings
    load_packed(packed_real.output, expect={"max_pixels": SMALL["max_pixels"], "merge_size": 2})
    from seqpack.io import StalePackedDatasetError

    with pytest.raises(StalePackedDatasetError, match=r"max_pixels: stored 50176, expected 1003520"):
        load_packed(packed_real.output, expect={"max_pixels": 1003520})
    # without load_media no pixels are computed
    assert all("pixel_values" not in m for m in load_packed(packed_real.output)[0].media if m)


def test_offline_media_parquet_holds_no_pixels(packed_real):
    import pyarrow.parquet as pq

    table = pq.read_table(packed_real.output / packed_real.metadata.shards[0].file)
    assert "media" in table.column_names
    entries = [json.loads(x) for x in table.column("media").to_pylist() if x]
    assert entries and all(set(e) == {"images", "image_grid_thw", "image_tokens"} for seg in entries for e in seg if e)
    total = sum(f.stat().st_size for f in (packed_real.output / "data").iterdir())
    assert total < 200_000  # references only: ~100 images' pixels would be tens of MB


def _llava(tmp_path: Path, records: list[dict], name="d.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(records))
    return p


def _rec(image, answer="A cat sitting on a mat.", user="<image>What is this?"):
    return llava_record(image, user=user, answer=answer)


@pytest.fixture()
def img_dir(shared_data, tmp_path):
    import shutil

    shutil.copy(shared_data / "lmms-finetune" / "images" / "bm.jpg", tmp_path / "a.jpg")
    return tmp_path


def test_offline_media_missing_image_named(img_dir, qwen3_tokenizer):
    data = _llava(img_dir, [_rec("a.jpg"), _rec("nope.jpg"), _rec(None, user="hello")])
    with pytest.raises(ValueError) as ei:
        pack_dataset(data, img_dir / "out", tokenizer=qwen3_tokenizer, seq_length=1024, **SMALL)
    msg = str(ei.value)
    assert "nope.jpg" in msg and "d.json" in msg and ("1" in msg)
    assert not (img_dir / "out").exists()
    res = pack_dataset(data, img_dir / "out", tokenizer=qwen3_tokenizer, seq_length=1024, on_error="skip", **SMALL)
    assert res.metadata.counts["samples_packed"] == 2 and res.metadata.counts["records_read"] == 3
    bad = [e for e in res.report.entries if e.status == "skipped"]
    assert len(bad) == 1 and bad[0].index == 1 and "nope.jpg" in bad[0].detail


def test_offline_media_unreadable_image_named(img_dir, qwen3_tokenizer):
    (img_dir / "broken.jpg").write_text("not an image")
    data = _llava(img_dir, [_rec("a.jpg"), _rec("broken.jpg")])
    with pytest.raises(ValueError, match=r"d\.json:1.*broken\.jpg.*on_error='skip'"):
        pack_dataset(data, img_dir / "out", tokenizer=qwen3_tokenizer, seq_length=1024, **SMALL)
    res = pack_dataset(data, img_dir / "out", tokenizer=qwen3_tokenizer, seq_length=1024, on_error="skip", **SMALL)
    (e,) = res.report.entries
    assert (e.status, e.reason, e.index) == ("skipped", "bad_media", 1)
    assert [s["sample_id"] for s in load_packed(res.output).report()] == ["d.json:1"]


def test_offline_media_overlength_policies(img_dir, qwen3_tokenizer, vt):
    long_answer = " ".join(["word"] * 300)
    recs = [_rec("a.jpg", answer=long_answer), _rec("a.jpg", user="Some context first. " * 50 + "<image>",
                                                    answer="short"), _rec(None, user="hi", answer="ok")]
    data = _llava(img_dir, recs)
    common = dict(tokenizer=qwen3_tokenizer, seq_length=256, **SMALL)
    res = pack_dataset(data, img_dir / "drop", overlength="drop", **common)
    assert res.metadata.counts["samples_packed"] == 1
    assert sorted((e.index, e.status, e.reason) for e in res.report.entries) == [
        (0, "dropped", "overlength"), (1, "dropped", "overlength")]
    res = pack_dataset(data, img_dir / "trunc", overlength="truncate", **common)
    by_idx = {e.index: e for e in res.report.entries}
    assert by_idx[0].status == "truncated" and by_idx[0].tokens_after == 256
    # the cut would fall inside record 1's image run: moved before it, which leaves no trained token
    assert (by_idx[1].status, by_idx[1].reason) == ("dropped", "no_trainable_tokens")
    assert res.metadata.counts["samples_packed"] == 2
    ds = load_packed(res.output)
    for i in range(len(ds)):
        row = ds[i]
        for j, m in enumerate(row.media or []):
            a, L = int(row.cu_seqlens_padded[j]), int(row.cu_seqlens[j + 1] - row.cu_seqlens[j])
            assert L <= 256
            runs = _runs(np.asarray(row.input_ids[a:a + L]), vt)
            want = [] if m is None else m["image_tokens"].tolist()
            assert runs == want  # a run is whole or absent, never cut
    with pytest.raises(ValueError, match="seq_length"):
        pack_dataset(data, img_dir / "err", overlength="error", **common)
    res = pack_dataset(data, img_dir / "split", overlength="split", **common)
    assert {(e.index, e.reason) for e in res.report.entries if e.status == "dropped"} >= {(0, "overlength_media")}


def test_offline_media_processor_settings_roundtrip(img_dir, qwen3_tokenizer, tmp_path):
    cfg = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 3136, "max_pixels": 28 * 28 * 16}
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "preprocessor_config.json").write_text(json.dumps(cfg))
    data = _llava(img_dir, [_rec("a.jpg")])
    res = pack_dataset(data, img_dir / "out", tokenizer=qwen3_tokenizer, seq_length=512,
                       image_processor=tmp_path / "proc")
    media = res.metadata.media
    assert media["max_pixels"] == 28 * 28 * 16 and media["min_pixels"] == 3136
    m = load_packed(res.output, load_media=True)[0].media[0]
    assert int(np.prod(m["image_grid_thw"])) <= 16 * 4 and m["pixel_values"].shape[0] == int(np.prod(m["image_grid_thw"]))
    # CLI overrides
    r = runner.invoke(app, ["pack", str(data), "--output", str(img_dir / "cli"), "--seq-length", "512", "-q",
                            "--image-processor", str(tmp_path / "proc"), "--max-pixels", str(28 * 28 * 8)])
    assert r.exit_code == 0, r.output
    assert json.loads((img_dir / "cli" / "metadata.json").read_text())["media"]["max_pixels"] == 28 * 28 * 8
    assert "image tokens" in r.output
    r = runner.invoke(app, ["pack", str(data), "--output", str(img_dir / "cli2"), "-q",
                            "--image-processor", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "--image-processor" in r.output and "preprocessor_config.json" in r.output
    r = runner.invoke(app, ["pack", str(data), "--output", str(img_dir / "cli3"), "-q",
                            "--min-pixels", "9000", "--max-pixels", "4000"])
    assert r.exit_code == 2 and "--min-pixels" in r.output
    with pytest.raises(PackConfigError):
        pack_dataset(data, img_dir / "x", tokenizer=qwen3_tokenizer, min_pixels=0)


def test_offline_media_cli_real_file(shared_data, tmp_path):
    r = runner.invoke(app, ["pack", str(shared_data / "llama-factory" / "mllm_demo.json"), "--output",
                            str(tmp_path / "o"), "-q", "--max-pixels", str(SMALL["max_pixels"])])
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "o" / "metadata.json").read_text())
    assert meta["counts"]["samples_packed"] == 6 and meta["counts"]["images"] == 8
    r = runner.invoke(app, ["inspect", str(tmp_path / "o"), "--no-plot"])
    assert r.exit_code == 0 and "image tokens" in r.output


def test_offline_media_writer_refuses_unexpanded_images(tmp_path):
    """A row whose images have no grid (placeholders never expanded) is refused, not written wrong."""
    from seqpack.sample import Sample, shift_labels
    from seqpack.io import PackedMetadata
    from seqpack.packed import build_packed_sequence

    ids = np.arange(1, 9, dtype=np.int32)
    s = Sample(ids, shift_labels(ids, np.ones(8, bool)), "x:0", "x", 0, media={"images": ["/a.jpg"]})
    row = build_packed_sequence([s], pad_token_id=0)
    with pytest.raises(ValueError, match="image_grid_thw"):
        write_packed([row], tmp_path / "o", PackedMetadata(seq_length=8))
    assert not (tmp_path / "o").exists()


def test_offline_media_load_media_on_text_dataset(tmp_path, qwen3_tokenizer):
    res = pack_dataset(None, tmp_path / "t", tokenizer=qwen3_tokenizer, seq_length=4096)
    assert res.metadata.media is None and load_packed(res.output)[0].media is None
    with pytest.raises(PackedDatasetError, match="no images"):
        load_packed(res.output, load_media=True)


def test_offline_media_moved_image_named_at_load(img_dir, qwen3_tokenizer):
    data = _llava(img_dir, [_rec("a.jpg")])
    res = pack_dataset(data, img_dir / "out", tokenizer=qwen3_tokenizer, seq_length=512, **SMALL)
    (img_dir / "a.jpg").rename(img_dir / "b.jpg")
    ds = load_packed(res.output, load_media=True)
    with pytest.raises(PackedDatasetError, match=r"pack 0, segment 0 .*a\.jpg"):
        ds[0]


def test_offline_media_in_memory_image_refused(img_dir, qwen3_tokenizer):
    from PIL import Image

    recs = [_rec(Image.new("RGB", (56, 56), (10, 20, 30))), _rec(str(img_dir / "a.jpg"))]
    # record lists have no data folder: their media root is the current directory unless media_dir= says
    with pytest.raises(ValueError, match=r"records:0.*in-memory Image.*save the images to files"):
        pack_dataset(recs, img_dir / "out", tokenizer=qwen3_tokenizer, seq_length=512, media_dir=img_dir, **SMALL)
    res = pack_dataset(recs, img_dir / "out", tokenizer=qwen3_tokenizer, seq_length=512, on_error="skip",
                       media_dir=img_dir, **SMALL)
    assert [(e.index, e.reason) for e in res.report.entries] == [(0, "bad_media")]
    assert res.metadata.counts["images"] == 1
