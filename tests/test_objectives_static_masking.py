"""Static masking (BERT's duplicated data, RoBERTa's baseline): a mask is a function of (seed, sample, copy).

Same copy -> the same mask in every epoch that shows it; another copy -> another mask; the batch a sample
lands in, its padding, the rank's seed and the objective's generator change nothing; a resumed run is exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmforge.cli.main import main
from lmforge.config import ConfigError
from lmforge.data import DocumentBatch, DocumentDataset
from lmforge.objectives import MaskedLM, MaskedLMAndNSP
from lmforge.objectives.nsp import NextSentencePrediction
from lmforge.objectives.static_masking import copy_generator, copy_index
from lmforge.tokenization import Tokenizer
from lmforge.training.distributed import rank_seed
from lmforge.training.pretrain import build_pretraining, objective_kwargs
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401
from test_training_resume import assert_same_weights, config, curve, weights

PAD, CLS, SEP, MASK = 0, 1, 2, 3
V = 100


def make_mlm(**kw) -> MaskedLM:
    kw = {"vocab_size": V, "mask_token_id": MASK, "pad_token_id": PAD, "cls_token_id": CLS, "sep_token_id": SEP,
          "add_cls_sep": True, "masking": "static", "static_copies": 3, "seed": 0, **kw}
    return MaskedLM(**kw)


def batch_of(seqs, epoch, ids) -> DocumentBatch:
    return DocumentBatch([torch.tensor(s) for s in seqs], epoch=epoch, sample_ids=ids)


SEQS = [list(range(10, 10 + n)) for n in (40, 25, 33, 40)]
IDS = [0, 40, 65, 98]


def test_layout_by_hand_and_the_mask_is_that_of_the_sequences_own_generator():
    mlm = make_mlm(mlm_probability=1.0, mask_prob=1.0, random_prob=0.0)
    batch = mlm(batch_of([[10, 11, 12], [13]], epoch=0, ids=[5, 9]))
    assert batch["input_ids"].tolist() == [[CLS, MASK, MASK, MASK, SEP], [CLS, MASK, SEP, PAD, PAD]]
    assert batch["labels"].tolist() == [[-100, 10, 11, 12, -100], [-100, 13, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]

    # The formula: row b is the dynamic masking of [CLS] x_b [SEP] alone, drawn from copy_generator(seed, id_b,
    # epoch mod N), and padded.
    mlm = make_mlm(seed=4)
    epoch = 7
    batch = mlm(batch_of(SEQS, epoch, IDS))
    for b, (seq, sample_id) in enumerate(zip(SEQS, IDS)):
        framed = torch.tensor([[CLS, *seq, SEP]])
        g = copy_generator(4, sample_id, copy_index(epoch, 3))
        want_inputs, want_labels = mlm.mask_tokens(framed, torch.ones_like(framed, dtype=torch.bool), g)
        n = framed.size(1)
        assert torch.equal(batch["input_ids"][b, :n], want_inputs[0])
        assert torch.equal(batch["labels"][b, :n], want_labels[0])
        assert (batch["input_ids"][b, n:] == PAD).all() and (batch["labels"][b, n:] == -100).all()
    assert copy_index(7, 3) == 1 and copy_index(3, 3) == 0


def test_same_copy_identical_across_epochs_other_copies_differ():
    mlm = make_mlm()
    by_epoch = [mlm(batch_of(SEQS, epoch, IDS)) for epoch in range(7)]  # copies 0 1 2 0 1 2 0
    for e in range(7):
        for f in range(7):
            same = all(torch.equal(by_epoch[e][k], by_epoch[f][k]) for k in ("input_ids", "labels"))
            assert same == (e % 3 == f % 3), (e, f)
    # Every copy really masks: 15% of 138 tokens (20.7, sd 4.2), with a different selection per copy.
    selections = [(by_epoch[e]["labels"] != -100) for e in range(3)]
    assert all(8 <= int(s.sum()) <= 34 for s in selections), [int(s.sum()) for s in selections]
    assert not torch.equal(selections[0], selections[1]) and not torch.equal(selections[1], selections[2])


def test_mask_depends_on_the_sample_not_on_its_batch_position_padding_or_generator_state():
    mlm = make_mlm()
    whole = mlm(batch_of(SEQS, 4, IDS))
    mlm.generator.manual_seed(12345)  # the objective's own stream plays no part
    reordered = mlm(batch_of(SEQS[::-1][:2], 4, IDS[::-1][:2]))  # other neighbours, other padding
    for b_new, b_old in ((0, 3), (1, 2)):
        n = len(SEQS[b_old]) + 2
        assert torch.equal(reordered["input_ids"][b_new, :n], whole["input_ids"][b_old, :n])
        assert torch.equal(reordered["labels"][b_new, :n], whole["labels"][b_old, :n])
    # Another sample id -> another mask for the very same tokens; another seed too, unless static_seed pins it.
    other_id = mlm(batch_of(SEQS[:1], 4, [1]))
    assert not torch.equal(other_id["labels"][0], whole["labels"][0, :42])
    rank1 = make_mlm(seed=99, static_seed=0)(batch_of(SEQS, 4, IDS))
    assert torch.equal(rank1["labels"], whole["labels"]) and torch.equal(rank1["input_ids"], whole["input_ids"])
    assert not torch.equal(make_mlm(seed=99)(batch_of(SEQS, 4, IDS))["labels"], whole["labels"])


def test_bad_options_and_unidentified_batches_are_refused():
    with pytest.raises(ConfigError, match=r"^objective option masking='sometimes' is not one of dynamic, static;"):
        make_mlm(masking="sometimes")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="static_copies"):
            make_mlm(static_copies=bad)
    with pytest.raises(ValueError, match="static masking needs batches that carry their epoch and sample ids"):
        make_mlm()([[10, 11, 12]])
    with pytest.raises(ValueError, match="samples but"):
        DocumentBatch([torch.tensor([1])], epoch=0, sample_ids=[1, 2])
    # Dynamic masking (the default) takes plain lists, as before.
    assert make_mlm(masking="dynamic")([[10, 11, 12]])["input_ids"].shape == (1, 5)


def test_nsp_pairs_refuse_static_masking_in_one_line():
    # A pair is drawn anew in every batch, so no sequence has a fixed mask to keep: refused, not silently dynamic.
    with pytest.raises(ConfigError, match=r"^objective option masking='static' does not work with NSP pairs"):
        MaskedLMAndNSP(vocab_size=V, mask_token_id=MASK, cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD,
                       masking="static")
    with pytest.raises(ConfigError, match="masking='static'"):
        NextSentencePrediction(cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD, mlm=make_mlm())
    MaskedLMAndNSP(vocab_size=V, mask_token_id=MASK, cls_token_id=CLS, sep_token_id=SEP, pad_token_id=PAD,
                   masking="dynamic")


def test_cli_refuses_an_unknown_masking_in_one_line_and_writes_nothing(data_root, tmp_path, capsys):
    data = prepared(data_root, "bert")
    out = tmp_path / "run"
    assert main(pretrain_args("mlm", data, out) + ["--objective-option", "masking=sometimes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "masking='sometimes' is not one of dynamic, static" in err[0], err
    assert not out.exists()


def test_document_samples_keep_their_id_across_epochs_shuffles_and_batch_sizes(data_root):
    data = prepared(data_root, "bert")
    seen = []
    for batch_size, seed in ((4, 0), (3, 5)):
        ds = DocumentDataset(data, max_len=30, batch_size=batch_size, seed=seed)
        for epoch in range(2):
            epoch_map = {}
            for i in range(len(ds)):
                batch = ds.get_batch(epoch, i)
                assert isinstance(batch, DocumentBatch) and batch.epoch == epoch
                for sample_id, x in zip(batch.sample_ids, batch):
                    assert sample_id not in epoch_map  # unique within an epoch
                    epoch_map[sample_id] = x.tolist()
            seen.append(epoch_map)
    # One id -> one segment, whatever the epoch, seed or batch size (the last partial batch drops a few samples).
    for a in seen:
        for b in seen:
            assert all(a[k] == b[k] for k in a.keys() & b.keys())
            assert len(a.keys() & b.keys()) > 0.9 * len(a)
    # The order differs between epochs, so identity is not the position in the epoch.
    ds = DocumentDataset(data, max_len=30, batch_size=4, seed=0)
    assert ds.get_batch(0, 0).sample_ids != ds.get_batch(1, 0).sample_ids


def test_pretraining_repeats_each_copy_every_n_epochs(data_root, tmp_path):
    """Through build_pretraining: the training objective masks every sample identically in epochs 0 and 2
    (static_copies=2), and differently in epoch 1."""
    data = prepared(data_root, "bert")
    cfg = config("mlm", data, tmp_path / "run", batch_size=8, objective_options={"masking": "static",
                                                                                 "static_copies": 2})
    trainer = build_pretraining(cfg).trainer
    masks: list[dict[int, list[int]]] = []
    for _ in range(3):  # three epochs, as the trainer reads them
        epoch_masks = {}
        for raw in trainer.train_data:
            batch = trainer.objective(raw)
            for sample_id, row, real in zip(raw.sample_ids, batch["input_ids"], batch["attention_mask"]):
                epoch_masks[sample_id] = row[real.bool()].tolist()
        masks.append(epoch_masks)
    assert trainer.train_data.epoch == 3
    common = masks[0].keys() & masks[1].keys() & masks[2].keys()  # each epoch drops its last partial batch
    assert len(common) > 0.9 * len(masks[0])
    assert all(masks[0][k] == masks[2][k] for k in common)
    differ = sum(masks[0][k] != masks[1][k] for k in common)
    assert differ > 0.5 * len(common)  # a short segment may draw no target in either copy


@pytest.mark.parametrize("workers", [0, 1])
def test_stop_and_resume_with_static_masking_is_exact(workers, data_root, tmp_path):
    data = prepared(data_root, "bert")
    options = {"masking": "static", "static_copies": 2}

    def run(name: str, **settings):
        return build_pretraining(config("mlm", data, tmp_path / name, num_workers=workers,
                                        objective_options=options, **settings)).trainer

    run("ref").fit()
    assert run("run").fit(steps=3).step == 3
    assert run("run", resume=True).fit().step == 6
    assert curve(tmp_path / "run") == curve(tmp_path / "ref")
    assert [r["step"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())] \
        == [1, 2, 3, 4, 5, 6]
    assert_same_weights(weights(tmp_path / "run" / "model"), weights(tmp_path / "ref" / "model"))
    saved = Path(tmp_path / "run" / "config.yaml").read_text()
    assert "masking: static" in saved


def test_ranks_share_the_static_masks(data_root):
    """Under data parallelism a sample moves between ranks from epoch to epoch, and ranks mask dynamically with
    different seeds; the static mask of a sample must still be one, as pretrain wires it (static_seed = run seed)."""
    data = prepared(data_root, "bert")
    tok = Tokenizer.load(data / "tokenizer")
    options = {"masking": "static", "static_copies": 2}
    masks: dict[tuple[int, int], list[int]] = {}
    where: dict[int, set[int]] = {}
    for rank in (0, 1):
        mlm = MaskedLM(**objective_kwargs("mlm", tok, rank_seed(5, rank), options, static_seed=5))
        ds = DocumentDataset(data, max_len=30, batch_size=4, seed=5, rank=rank, world_size=2)
        for epoch in (0, 2):  # both show copy 0
            for i in range(len(ds)):
                raw = ds.get_batch(epoch, i)
                batch = mlm(raw)
                for sample_id, row, real in zip(raw.sample_ids, batch["labels"], batch["attention_mask"]):
                    key = (sample_id, epoch % 2)
                    assert masks.setdefault(key, row[real.bool()].tolist()) == row[real.bool()].tolist()
                    where.setdefault(sample_id, set()).add(rank)
    assert sum(len(r) == 2 for r in where.values()) > 0.3 * len(where)  # many samples met both ranks
