"""StreamingPacker resume at epoch boundaries: a state saved after an epoch's last pack, or after its loop
ended, resumes exactly, by direct iteration and through StatefulDataLoader, in-process and after a real
SIGKILL in a new process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from _stream_data import keys_of, lognormal_lengths  # noqa: E402

from seqpack.stream import StreamingPacker  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LENS = lognormal_lengths(300, 1024, 5)


def _packer():
    return StreamingPacker(LENS, 1024, packing_buffer_size=32, output="indices", seed=3)


def _epochs(p, epochs):
    out = {}
    for e in epochs:
        p.set_epoch(e)
        out[e] = [pk.tolist() for pk in p]
    return out


REF = _epochs(_packer(), (0, 1, 2))


def test_reference_epochs_differ_and_cover_every_sample():
    assert REF[0] != REF[1]
    for e in REF:
        assert sorted(keys_of(REF[e])) == list(range(len(LENS)))


@pytest.mark.parametrize("then", ["set_epoch_before_load", "set_epoch_after_load"])
def test_state_after_the_loop_then_next_epoch_direct(then):
    p = _packer()
    p.set_epoch(0)
    _ = list(p)
    state = p.state_dict()
    assert state["finished"]
    q = _packer()
    if then == "set_epoch_before_load":
        q.set_epoch(1)
        q.load_state_dict(state)
    else:
        q.load_state_dict(state)
        q.set_epoch(1)
    assert [pk.tolist() for pk in q] == REF[1]


def test_state_after_the_loop_same_epoch_is_empty_then_next_epoch():
    p = _packer()
    p.set_epoch(0)
    _ = list(p)
    q = _packer()
    q.load_state_dict(p.state_dict())
    q.set_epoch(0)
    assert list(q) == []  # epoch 0 was complete
    q.set_epoch(1)
    assert [pk.tolist() for pk in q] == REF[1]


def test_state_after_the_last_pack_before_stopiteration():
    p = _packer()
    p.set_epoch(0)
    it = iter(p)
    for _ in range(len(REF[0])):
        next(it)
    state = p.state_dict()  # before the generator's StopIteration
    q = _packer()
    q.load_state_dict(state)
    q.set_epoch(0)
    assert list(q) == []
    q.set_epoch(1)
    assert [pk.tolist() for pk in q] == REF[1]


def test_a_mid_epoch_state_refuses_another_epoch():
    p = _packer()
    p.set_epoch(0)
    it = iter(p)
    head = [next(it).tolist() for _ in range(3)]
    q = _packer()
    q.load_state_dict(p.state_dict())
    q.set_epoch(1)
    with pytest.raises(ValueError, match=r"stops inside epoch 0 .* set_epoch\(1\) .* Call set_epoch\(0\)"):
        iter(q)
    q.set_epoch(0)  # the state is still there: finishing epoch 0 works
    assert head + [pk.tolist() for pk in q] == REF[0]


@pytest.mark.parametrize("saved_after", ["last_pack", "loop_end"])
def test_stateful_dataloader_epoch_boundary(saved_after):
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    p = _packer()
    dl = tdl.StatefulDataLoader(p, batch_size=None, num_workers=0)
    p.set_epoch(0)
    got = []
    for pk in dl:
        got.append(pk.tolist())
        if saved_after == "last_pack" and len(got) == len(REF[0]):
            state = dl.state_dict()
    if saved_after == "loop_end":
        state = dl.state_dict()
    q = _packer()
    dl2 = tdl.StatefulDataLoader(q, batch_size=None, num_workers=0)
    dl2.load_state_dict(state)
    out = {}
    for e in (0, 1, 2) if saved_after == "last_pack" else (1, 2):
        q.set_epoch(e)
        out[e] = [pk.tolist() for pk in dl2]
    if saved_after == "last_pack":
        assert out.pop(0) == []
    assert out == {1: REF[1], 2: REF[2]}


# ------------------------------------------------------------------------------------ a real SIGKILL

_CHILD = textwrap.dedent(
    """
    import os, signal, sys, numpy as np, torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    from seqpack.stream import StreamingPacker
    sys.path.insert(0, sys.argv[3])
    from _stream_data import lognormal_lengths

    ckpt, kill_at = sys.argv[1], sys.argv[2]
    packer = StreamingPacker(lognormal_lengths(300, 1024, 5), 1024, packing_buffer_size=32, output="indices", seed=3)
    loader = StatefulDataLoader(packer, batch_size=None, num_workers=0)
    start, seen = 0, []
    if os.path.exists(ckpt):
        c = torch.load(ckpt)
        loader.load_state_dict(c["loader"])
        start, seen = c["epoch"], c["seen"]

    def save(epoch):
        torch.save({"loader": loader.state_dict(), "epoch": epoch, "seen": seen}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)

    for epoch in range(start, 3):
        packer.set_epoch(epoch)
        for pk in loader:
            seen.append([epoch] + [int(k) for k in pk])
            save(epoch)
            if kill_at == f"pack{len(seen)}":
                os.kill(os.getpid(), signal.SIGKILL)
        save(epoch + 1)  # the loop ended: the next run starts at the next epoch
        if kill_at == f"end{epoch}":
            os.kill(os.getpid(), signal.SIGKILL)
    print("DONE", len(seen))
    """
)


def _run(tmp_path, ckpt, kill_at):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(script), str(ckpt), kill_at, str(REPO / "tests" / "stream")],
                          env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.multiprocess
@pytest.mark.parametrize("kill_at", ["last_pack_of_epoch0", "end0", "mid_epoch1"])
def test_sigkill_at_epoch_boundaries_resumes_exactly(tmp_path, kill_at):
    pytest.importorskip("torchdata")
    n0 = len(REF[0])
    point = {"last_pack_of_epoch0": f"pack{n0}", "end0": "end0", "mid_epoch1": f"pack{n0 + 5}"}[kill_at]
    ckpt = tmp_path / "ckpt.pt"
    first = _run(tmp_path, ckpt, point)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    second = _run(tmp_path, ckpt, "never")
    assert second.returncode == 0, second.stderr[-3000:]
    seen = torch.load(ckpt)["seen"]
    want = [[e] + pk for e in (0, 1, 2) for pk in REF[e]]
    assert seen == want  # every epoch exactly once, in order, nothing replayed or skipped
