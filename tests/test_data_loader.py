"""Streaming loaders: packing, deterministic shuffling, exact resume, workers and ranks."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as Backend
from tokenizers import models, pre_tokenizers

from lmforge.data import DataError, DocumentDataset, PackedDataset, StatefulLoader
from lmforge.data.prepare import prepare
from lmforge.tokenization import Tokenizer

EOS = 1
N_DOCS = 90


def _documents() -> list[list[int]]:
    """Documents of distinct ids (2, 3, 4, ...), so every token says which document it came from."""
    rng = np.random.default_rng(0)
    docs, next_id = [], 2
    for _ in range(N_DOCS):
        n = int(rng.integers(1, 40))
        docs.append(list(range(next_id, next_id + n)))
        next_id += n
    return docs


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    docs = _documents()
    vocab = {"<unk>": 0, "</s>": EOS, **{f"t{i}": i for i in range(2, 1 + sum(map(len, docs)) + 2)}}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = Tokenizer(backend, roles={"unk": "<unk>", "eos": "</s>"})
    folder = tmp_path_factory.mktemp("data")
    (folder / "in.txt").write_text("\n\n".join(" ".join(f"t{i}" for i in d) for d in docs) + "\n")
    prepare([folder / "in.txt"], tok, folder / "out", val_fraction=0, shard_mb=0.002, progress=False)
    return folder / "out", docs


def _epoch(ds) -> list[torch.Tensor]:
    return list(ds)


def test_unshuffled_blocks_are_the_document_stream_in_order(data):
    folder, docs = data
    ds = PackedDataset(folder, seq_len=15, batch_size=2, shuffle=False)
    assert len(ds.data) > 3  # several shards, so blocks cross shard boundaries
    stream = np.array([t for d in docs for t in d + [EOS]])
    blocks = stream[: len(stream) // 16 * 16].reshape(-1, 16)
    batches = _epoch(ds)
    assert len(batches) == len(blocks) // 2 and all(b.shape == (2, 16) and b.dtype == torch.int64 for b in batches)
    assert torch.equal(torch.cat(batches), torch.from_numpy(blocks[: len(batches) * 2]))


def test_shuffled_epoch_is_a_permutation_of_whole_documents(data):
    """The shuffled stream holds whole documents in a new order each epoch, cut into blocks; the batches take
    those blocks in a shuffled order (within windows of WINDOW_BLOCKS), not stream order."""
    folder, docs = data
    ds = PackedDataset(folder, seq_len=31, batch_size=1, seed=3)
    epochs = [torch.cat(_epoch(ds)) for _ in range(2)]  # (blocks, 32) each, in batch order
    assert ds.epoch == 2 and not torch.equal(*epochs)
    by_first = {d[0]: d for d in docs}
    for epoch, batches in enumerate(epochs):
        in_stream_order = ds._samples(epoch, np.arange(len(batches)))  # the blocks as the stream cuts them
        stream = in_stream_order.flatten().tolist()
        pieces = " ".join(map(str, stream)).split(f" {EOS} ")
        seen = [list(map(int, p.split())) for p in pieces[:-1] if p]
        assert all(p == by_first[p[0]] for p in seen[1:])  # complete documents, in some order
        assert len({p[0] for p in seen}) == len(seen) and len(seen) >= N_DOCS - 3
        assert len(batches) <= PackedDataset.WINDOW_BLOCKS  # one window: the batches permute all the blocks
        assert sorted(map(tuple, batches.tolist())) == sorted(map(tuple, in_stream_order.tolist()))
        assert not torch.equal(batches, in_stream_order)  # consecutive batches are not consecutive text
    same = PackedDataset(folder, seq_len=31, batch_size=1, seed=3)
    assert torch.equal(torch.cat(_epoch(same)), epochs[0])
    other = PackedDataset(folder, seq_len=31, batch_size=1, seed=4)
    assert not torch.equal(torch.cat(_epoch(other)), epochs[0])


def test_shuffle_windows_keep_each_window_s_blocks(data, monkeypatch):
    """With windows smaller than the epoch, each window's blocks stay in that window (reading stays local)."""
    folder, _ = data
    monkeypatch.setattr(PackedDataset, "WINDOW_BLOCKS", 4)
    ds = PackedDataset(folder, seq_len=15, batch_size=2, seed=0)
    in_stream_order = ds._samples(0, np.arange(len(ds) * 2))
    batches = torch.cat(_epoch(ds))
    assert not torch.equal(batches, in_stream_order)
    for start in range(0, len(batches) // 4 * 4, 4):  # the full windows
        window = slice(start, start + 4)
        assert sorted(map(tuple, batches[window].tolist())) == sorted(map(tuple, in_stream_order[window].tolist()))


def _state_round_trip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)  # what a checkpoint does
    buffer.seek(0)
    return json.loads(json.dumps(torch.load(buffer)))


@pytest.mark.parametrize("kind", ["packed", "documents"])
def test_saved_state_resumes_at_the_exact_next_batch(data, kind):
    folder, _ = data

    def make():
        if kind == "packed":
            return PackedDataset(folder, seq_len=12, batch_size=3, seed=7)
        return DocumentDataset(folder, max_len=10, batch_size=3, seed=7)

    reference = make()
    run = [b for _ in range(2) for b in reference]  # two uninterrupted epochs
    per_epoch = len(reference)
    for stop in (0, 4, per_epoch - 1, per_epoch, per_epoch + 2):
        ds = make()
        taken = 0
        while taken < stop:  # stop early, as a training run that is checkpointed and killed would
            for _ in ds:
                taken += 1
                if taken == stop:
                    break
        state = _state_round_trip(ds.state_dict())
        resumed = make()
        resumed.load_state_dict(state)
        got = next(iter(resumed))
        want = run[stop]
        if kind == "packed":
            assert torch.equal(got, want), stop
        else:
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), stop


def test_workers_give_the_same_batches_and_resume_exactly(data):
    folder, _ = data
    plain = [b for b in StatefulLoader(PackedDataset(folder, seq_len=12, batch_size=2, seed=1))]
    loader = StatefulLoader(PackedDataset(folder, seq_len=12, batch_size=2, seed=1), num_workers=2)
    with_workers = []
    for i, batch in enumerate(loader):
        with_workers.append(batch)
        if i == 6:
            state = loader.state_dict()
    assert len(with_workers) == len(plain) and all(torch.equal(a, b) for a, b in zip(with_workers, plain))
    resumed = StatefulLoader(PackedDataset(folder, seq_len=12, batch_size=2, seed=1), num_workers=2)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(resumed, plain[7:], strict=True))
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["batch"] == 0


def _tokens(batches) -> list[int]:
    flat = [t for b in batches for x in (b if isinstance(b, list) else [b]) for t in x.flatten().tolist()]
    return [t for t in flat if t != EOS]


@pytest.mark.parametrize("kind", ["packed", "documents"])
def test_two_ranks_see_disjoint_data_covering_one_epoch(data, kind, monkeypatch):
    folder, docs = data

    def make(**kw):
        if kind == "packed":
            return PackedDataset(folder, seq_len=9, batch_size=1, seed=5, **kw)
        return DocumentDataset(folder, max_len=8, batch_size=1, seed=5, **kw)

    whole = _epoch(make(rank=0, world_size=1))
    ranks = [_epoch(make(rank=r, world_size=2)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(whole) // 2  # equal steps on every rank
    a, b = _tokens(ranks[0]), _tokens(ranks[1])
    assert not set(a) & set(b)
    # Sample g goes to rank g % 2: the ranks interleaved are the single-process epoch.
    interleaved = [x for pair in zip(ranks[0], ranks[1]) for x in pair]
    assert _tokens(interleaved) == _tokens(whole[: len(interleaved)])
    all_tokens = {t for d in docs for t in d}
    assert set(a) | set(b) <= all_tokens and len(all_tokens - set(a) - set(b)) <= 9 * 2
    # rank / world_size default from torch.distributed when it is initialised.
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    assert _tokens(_epoch(make())) == b


def test_document_segments_rebuild_every_document(data):
    folder, docs = data
    ds = DocumentDataset(folder, max_len=7, batch_size=1, shuffle=False)
    segments = [x.tolist() for batch in _epoch(ds) for x in batch]
    assert all(1 <= len(s) <= 7 for s in segments)
    rebuilt, current = [], []
    for s in segments:
        current += s
        if len(s) < 7 or current == docs[len(rebuilt)]:
            rebuilt.append(current)
            current = []
    assert rebuilt == docs
    assert sum(-(-len(d) // 7) for d in docs) == ds.num_samples() == len(segments)


def test_bad_settings_give_clear_errors(data, tmp_path):
    folder, _ = data
    ds = PackedDataset(folder, seq_len=12, batch_size=2)
    with pytest.raises(ValueError, match="saved seq_len=16 but this dataset has 12"):
        ds.load_state_dict({**ds.state_dict(), "seq_len": 16})
    with pytest.raises(ValueError, match="saved world_size=4"):
        ds.load_state_dict({**ds.state_dict(), "world_size": 4})
    with pytest.raises(ValueError, match="rank 2 is outside world_size 2"):
        PackedDataset(folder, seq_len=12, batch_size=2, rank=2, world_size=2)
    with pytest.raises(DataError, match="fewer than one batch"):
        PackedDataset(folder, seq_len=4000, batch_size=2)
    with pytest.raises(DataError, match="split 'val' is empty"):
        PackedDataset(folder, seq_len=12, batch_size=2, split="val")
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        PackedDataset(tmp_path, seq_len=12, batch_size=2)
    manifest = json.loads((folder / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    with pytest.raises(DataError, match="preparation incomplete"):
        PackedDataset(tmp_path, seq_len=12, batch_size=2)
    with pytest.raises(IndexError):
        ds.get_batch(0, len(ds))
