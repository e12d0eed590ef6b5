"""The media root: image references confined to it (``../``, absolute paths, symlinks out refused unless
opted out), packs storing paths relative to it, reading them back after the data moved, stored paths
checked on read, and images that are decompression bombs or broken turned into record errors."""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from seqpack.cli import app
from seqpack.data.formats import normalize_record
from seqpack.data.media import open_image
from seqpack.data.media.images import ImageError
from seqpack.data.media_root import MediaRoot, resolve_stored_image, stored_image_path
from seqpack.data.records import DataFormatError, RawRecord
from seqpack.io import PackedDatasetError, PackedMetadata, load_packed, write_packed
from seqpack.pipeline import PackConfigError, pack_dataset
from _helpers import llava_record

SMALL = {"max_pixels": 64 * 28 * 28, "min_pixels": 4 * 28 * 28}
runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


def _png(path: Path, size=(56, 56), colour=(200, 30, 30)) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, format="PNG")
    return path


def bomb_png(path: Path, width: int, height: int) -> Path:
    """A valid PNG header declaring ``width x height`` grey pixels, one row of data: a few dozen bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * (width + 1))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


_rec = llava_record


@pytest.fixture()
def tree(tmp_path):
    """tmp/data/{d.json, images/a.png, inside.png}, tmp/secret.png (outside the data folder)."""
    data = tmp_path / "data"
    _png(data / "images" / "a.png")
    _png(data / "inside.png", colour=(0, 90, 0))
    _png(tmp_path / "secret.png", colour=(0, 0, 255))
    return tmp_path


def _raw(tree: Path, image, line=3) -> RawRecord:
    return RawRecord(_rec(image), str(tree / "data" / "d.jsonl"), line - 1, line=line, base_dir=tree / "data")


# ------------------------------------------------------------------ confinement while reading records


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_reference_outside_the_root_is_refused_naming_file_line_ref_and_fix(tree, kind):
    if kind == "symlink":
        os.symlink(tree / "secret.png", tree / "data" / "images" / "link.png")
    ref = {"dotdot": "../secret.png", "absolute": str(tree / "secret.png"), "symlink": "link.png"}[kind]
    with pytest.raises(DataFormatError) as ei:
        normalize_record(_raw(tree, ref))
    e = ei.value
    assert e.reason == "media_outside_root" and e.line == 3
    msg = str(e)
    assert msg.startswith(f"{tree / 'data' / 'd.jsonl'}, line 3: image {ref!r} resolves to {tree / 'secret.png'}")
    assert f"outside the media root {tree / 'data'}" in msg
    # the Python API names its keywords; `seqpack pack` spells them as flags (test_cli_media_flags)
    assert "media_dir=DIR" in msg and "allow_any_media_path=True" in msg and "Fix:" in msg and "--media-dir" not in msg
    # the opt-out keeps the old behaviour: the file is read where it points
    conv = normalize_record(_raw(tree, ref), media=MediaRoot.create(None, allow_any=True))
    assert Path(conv.images[0]).resolve() == (tree / "secret.png").resolve()


def test_references_inside_the_root_keep_the_lookup_order(tree):
    os.symlink(tree / "data" / "inside.png", tree / "data" / "images" / "in_link.png")  # a symlink inside is fine
    got = [normalize_record(_raw(tree, ref)).images[0] for ref in
           ("a.png", "images/a.png", "inside.png", str(tree / "data" / "inside.png"), "in_link.png",
            "images/../inside.png")]
    d = tree / "data"
    assert got == [str(d / "images" / "a.png"), str(d / "images" / "a.png"), str(d / "inside.png"),
                   str(d / "inside.png"), str(d / "images" / "in_link.png"), str(d / "images/../inside.png")]
    with pytest.raises(DataFormatError) as ei:
        normalize_record(_raw(tree, "nope.png"))
    assert ei.value.reason == "missing_image" and "media_dir=DIR" in str(ei.value)


def test_explicit_media_dir(tree):
    media = MediaRoot.create(tree)  # the whole tmp folder: ../secret.png from data/ is now inside
    assert normalize_record(_raw(tree, "secret.png"), media=media).images == [str(tree / "secret.png")]
    assert normalize_record(_raw(tree, "data/inside.png"), media=media).images == [str(tree / "data/inside.png")]
    only_images = MediaRoot.create(tree / "data" / "images")
    assert normalize_record(_raw(tree, "a.png"), media=only_images).images == [str(tree / "data/images/a.png")]
    with pytest.raises(DataFormatError, match="outside the media root") as ei:
        normalize_record(_raw(tree, "../inside.png"), media=only_images)
    assert ei.value.reason == "media_outside_root"
    with pytest.raises(ValueError, match="media_dir=.*not an existing folder"):
        MediaRoot.create(tree / "missing")


def test_stored_path_rules(tree):
    root = tree / "data"
    assert stored_image_path(str(root / "images" / "a.png"), root) == "images/a.png"
    assert stored_image_path(str(tree / "secret.png"), root) == str(tree / "secret.png")  # opt-out: absolute
    assert stored_image_path("https://x/y.png", root) == "https://x/y.png"
    assert resolve_stored_image("images/a.png", root) == str(root / "images" / "a.png")
    for bad, why in (("/etc/passwd", "absolute"), ("../secret.png", r"'\.\.'"), ("images/../../secret.png", r"'\.\.'"),
                     ("", "non-empty"), (3, "non-empty"), ("C:/x.png", "absolute"), ("a\\..\\b.png", "absolute")):
        with pytest.raises(ValueError, match=why):
            resolve_stored_image(bad, root)
    os.symlink(tree / "secret.png", root / "out.png")
    with pytest.raises(ValueError, match="outside the media root"):
        resolve_stored_image("out.png", root)
    assert resolve_stored_image("out.png", root, allow_any=True) == str(root / "out.png")
    assert resolve_stored_image("/etc/passwd", root, allow_any=True) == "/etc/passwd"


# ------------------------------------------------------------------ the offline job


def test_pack_skips_escapes_with_reasons_and_refuses_by_default(tree, qwen3_tokenizer):
    os.symlink(tree / "secret.png", tree / "data" / "images" / "link.png")
    recs = [_rec("a.png"), _rec("../secret.png"), _rec(str(tree / "secret.png")), _rec("link.png"),
            _rec(None, user="hello")]
    data = tree / "data" / "d.json"
    data.write_text(json.dumps(recs))
    common = dict(tokenizer=qwen3_tokenizer, seq_length=512, **SMALL)
    with pytest.raises(DataFormatError, match=r"d\.json, record 1: image '\.\./secret\.png' .*outside the media root"):
        pack_dataset(data, tree / "out", **common)
    assert not (tree / "out").exists()
    res = pack_dataset(data, tree / "out", on_error="skip", **common)
    assert [(e.index, e.status, e.reason) for e in res.report.entries] == [
        (1, "skipped", "media_outside_root"), (2, "skipped", "media_outside_root"), (3, "skipped", "media_outside_root")]
    assert res.metadata.counts["samples_packed"] == 2 and res.metadata.counts["records_read"] == 5
    assert res.metadata.counts["skipped"] == {"media_outside_root": 3}
    assert [r["reason"] for r in load_packed(res.output).report()] == ["media_outside_root"] * 3
    # opt-out: every record packed
    res = pack_dataset(data, tree / "any", allow_any_media_path=True, **common)
    assert res.metadata.counts["samples_packed"] == 5 and not res.report.entries
    assert res.metadata.extra["fingerprint_extra"] == {"allow_any_media_path": True}  # it changes what is packed
    load_packed(res.output, verify=True)
    # the stored path of an image outside the root stays absolute, and reading it needs the opt-out too
    with pytest.raises(PackedDatasetError, match=r"row \d+ of shard data/.*is absolute.*allow_any_media_path=True"):
        [load_packed(res.output)[i] for i in range(res.num_packs)]
    ds = load_packed(res.output, allow_any_media_path=True, load_media=True)
    assert sum(len(m["images"]) for i in range(len(ds)) for m in ds[i].media or [] if m) == 4
    with pytest.raises(PackConfigError, match="media_dir=.*not an existing folder"):
        pack_dataset(data, tree / "x", media_dir=tree / "missing", **common)


def _media_column(out: Path) -> list:
    table = pq.read_table(next((out / "data").glob("*.parquet")))
    return [seg for x in table.column("media").to_pylist() if x for seg in json.loads(x) if seg]


def test_pack_stores_relative_paths_and_survives_a_move(tree, qwen3_tokenizer):
    data = tree / "data" / "d.json"
    data.write_text(json.dumps([_rec("a.png"), _rec("inside.png"), _rec(None, user="hi")]))
    common = dict(tokenizer=qwen3_tokenizer, seq_length=512, **SMALL)
    res = pack_dataset(data, tree / "data" / "packed", **common)
    stored = sorted(p for seg in _media_column(res.output) for p in seg["images"])
    assert stored == ["images/a.png", "inside.png"]  # relative to the media root, POSIX
    media = res.metadata.media
    assert media["media_root"] == str(tree / "data") and media["media_root_relative"] == ".."
    fp, shard_sha = res.metadata.fingerprint, res.metadata.shards[0].sha256

    moved = tree / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(tree / "data", moved)
    ds = load_packed(moved / "packed", load_media=True, verify=True)
    assert ds.media.root == moved
    got = sorted(p for i in range(len(ds)) for m in ds[i].media or [] if m for p in m["images"])
    assert got == [str(moved / "images" / "a.png"), str(moved / "inside.png")]
    assert all(m["pixel_values"].shape[0] == int(np.prod(m["image_grid_thw"], axis=1).sum())
               for i in range(len(ds)) for m in ds[i].media or [] if m)
    # packing the moved data again: same fingerprint, byte-identical shard
    again = pack_dataset(moved / "d.json", tree / "again", **common)
    assert again.metadata.fingerprint == fp and again.metadata.shards[0].sha256 == shard_sha
    assert again.metadata.media["media_root"] == str(moved)
    # a pack kept apart from its data: the recorded root is gone, media_dir= names the new place
    shutil.move(moved, tree / "third")
    with pytest.raises(PackedDatasetError, match=r"media root .*moved.*media_dir="):
        load_packed(tree / "again", load_media=True)[0]
    ds = load_packed(tree / "again", load_media=True, media_dir=tree / "third")
    assert all(p.startswith(str(tree / "third")) for i in range(len(ds)) for m in ds[i].media or [] if m
               for p in m["images"])
    with pytest.raises(PackedDatasetError, match="media_dir=.*not an existing folder"):
        load_packed(tree / "again", media_dir=tree / "nowhere")


def test_cli_media_flags(tree):
    data = tree / "data" / "d.json"
    data.write_text(json.dumps([_rec("a.png"), _rec("../secret.png")]))
    args = ["pack", str(data), "-q", "--max-pixels", str(SMALL["max_pixels"]), "--output"]
    r = runner.invoke(app, [*args, str(tree / "o1")])
    assert r.exit_code == 1 and "outside the media root" in r.output
    assert ("name the folder that holds them with --media-dir DIR, or pass --allow-any-media-path if you trust"
            in " ".join(r.output.split())), r.output
    data2 = tree / "data" / "d2.json"
    data2.write_text(json.dumps([_rec("data/images/a.png"), _rec("secret.png")]))
    r = runner.invoke(app, ["pack", str(data2), "-q", "--max-pixels", str(SMALL["max_pixels"]), "--output",
                            str(tree / "o2"), "--media-dir", str(tree)])
    assert r.exit_code == 0, r.output
    meta = json.loads((tree / "o2" / "metadata.json").read_text())
    assert meta["media"]["media_root"] == str(tree) and meta["counts"]["images"] == 2
    assert sorted(p for seg in _media_column(tree / "o2") for p in seg["images"]) == ["data/images/a.png", "secret.png"]
    r = runner.invoke(app, [*args, str(tree / "o3"), "--allow-any-media-path"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, [*args, str(tree / "o4"), "--media-dir", str(tree / "missing")])
    assert r.exit_code == 2 and "--media-dir" in r.output


# ------------------------------------------------------------------ crafted stored paths


def _crafted_pack(out: Path, images: list, root: Path) -> Path:
    from seqpack.packed import build_packed_sequence
    from seqpack.sample import Sample, shift_labels

    ids = np.arange(1, 9, dtype=np.int32)
    media = {"images": images, "image_grid_thw": np.array([[1, 2, 2]] * len(images)), "image_tokens": [1] * len(images)}
    row = build_packed_sequence([Sample(ids, shift_labels(ids, np.ones(8, bool)), "x:0", "x", 0, media=media)],
                                pad_token_id=0)
    meta = PackedMetadata(seq_length=8, media={"merge_size": 2, "media_root": str(root)})
    write_packed([row], out, meta)
    return out


@pytest.mark.parametrize("stored,why", [("../secret.png", r"climbs out of the media root with '\.\.'"),
                                        ("/etc/passwd", "is absolute"), ("link.png", "outside the media root")])
def test_crafted_stored_path_refused_on_read(tree, stored, why):
    os.symlink(tree / "secret.png", tree / "data" / "link.png")
    out = _crafted_pack(tree / "p", ["images/a.png", stored], tree / "data")
    ds = load_packed(out)
    with pytest.raises(PackedDatasetError, match=rf"pack 0 \(row 0 of shard data/shard-00000\.parquet\), segment 0: "
                                                 rf"stored image path .*{why}.*re-pack the data, give media_dir="):
        ds[0]
    assert load_packed(out, allow_any_media_path=True)[0].media[0]["images"][0] == str(tree / "data/images/a.png")


# ------------------------------------------------------------------ decompression bombs, broken images


def test_open_image_refuses_bombs_and_broken_files(tmp_path):
    from PIL import Image

    warn = bomb_png(tmp_path / "warn.png", 10_000, 10_000)  # 1e8 px: PIL only warns (limit ~8.9e7)
    err = bomb_png(tmp_path / "err.png", 30_000, 30_000)  # 9e8 px: PIL raises DecompressionBombError
    assert warn.stat().st_size < 200 and Image.MAX_IMAGE_PIXELS < 10_000 * 10_000 < 2 * Image.MAX_IMAGE_PIXELS
    for p, size in ((warn, "100000000 pixels"), (err, "900000000 pixels")):
        with pytest.raises(ImageError, match=rf"image {p} is too large to decode safely.*MAX_IMAGE_PIXELS") as ei:
            open_image(p)
        assert ei.value.reason == "image_too_large"
        assert str(ei.value).startswith(  # one limit named: seqpack's, not also PIL's error threshold
            f"image {p} is too large to decode safely ({size}); seqpack refuses images over "
            f"PIL.Image.MAX_IMAGE_PIXELS = {Image.MAX_IMAGE_PIXELS} pixels, a decompression bomb guard."), str(ei.value)
    import pickle

    e2 = pickle.loads(pickle.dumps(ei.value))
    assert e2.reason == "image_too_large" and str(e2) == str(ei.value)
    good = _png(tmp_path / "good.png", size=(64, 64))
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good.read_bytes()[:60])
    (tmp_path / "text.png").write_text("not an image")
    for name in ("truncated.png", "text.png"):
        with pytest.raises(ImageError, match=rf"cannot read image .*{name}") as ei:
            open_image(tmp_path / name)
        assert ei.value.reason == "bad_media"
    assert open_image(good).size == (64, 64)


def test_pack_reports_a_bomb_and_names_it_by_default(tree, qwen3_tokenizer):
    bomb_png(tree / "data" / "images" / "bomb.png", 10_000, 10_000)
    good = (tree / "data" / "images" / "a.png").read_bytes()
    (tree / "data" / "images" / "cut.png").write_bytes(good[: len(good) // 2])
    data = tree / "data" / "d.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [_rec("a.png"), _rec("bomb.png"), _rec("cut.png")]) + "\n")
    common = dict(tokenizer=qwen3_tokenizer, seq_length=512, **SMALL)
    with pytest.raises(ValueError) as ei:
        pack_dataset(data, tree / "out", **common)
    msg = str(ei.value)
    assert "d.jsonl:1" in msg and "line 2" in msg and "bomb.png" in msg and "too large" in msg and "Fix:" in msg
    assert "Traceback" not in msg and not (tree / "out").exists()
    res = pack_dataset(data, tree / "out", on_error="skip", **common)
    assert [(e.index, e.status, e.reason) for e in res.report.entries] == [
        (1, "skipped", "image_too_large"), (2, "skipped", "bad_media")]
    assert res.metadata.counts["samples_packed"] == 1
    assert res.metadata.counts["skipped"] == {"image_too_large": 1, "bad_media": 1}
