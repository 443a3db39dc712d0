"""Bias probe on minimal pairs: the pseudo-log-likelihood equals a hand loop over masked positions (and the same
loop on Hugging Face's BertForMaskedLM logits), a decoder's log-likelihood equals summed log-softmax, the metric
equals a hand count per category, and the CLI reads CrowS-Pairs' format and refuses bad files in one line."""

from __future__ import annotations

import csv
import importlib
import json
import os
from pathlib import Path

import pytest
import torch

import lmforge
from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.errors import UserInputError
from lmforge.evaluation import bias_pairs as bp
from lmforge.tokenization import train_tokenizer
from tests import task_helpers as th

FIXTURE = Path(__file__).parent / "fixtures" / "bias_pairs_illustrative.csv"


def _rows(path: Path = FIXTURE) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bias")
    text = [r[k] for r in _rows() for k in ("sent_more", "sent_less")]
    (folder / "corpus.txt").write_text("\n\n".join(text * 5) + "\n", encoding="utf-8")
    return {family: train_tokenizer([folder / "corpus.txt"], kind=kind, vocab_size=size, family=family,
                                    min_frequency=1, show_progress=False)
            for family, kind, size in (("bert", "wordpiece", 200), ("gpt", "byte-bpe", 300))}


def _model(family, tok):
    torch.manual_seed(0)
    return th.body(family, tok).eval()


def _hand_pll(logits_of, ids: list[int], positions: list[int], mask_id: int) -> float:
    """One unbatched forward pass per position, that position alone masked."""
    total = 0.0
    for p in positions:
        masked = list(ids)
        masked[p] = mask_id
        logits = logits_of(torch.tensor([masked]))[0, p]
        total += float(torch.log_softmax(logits.double(), -1)[ids[p]])
    return total


def test_pseudo_log_likelihood_equals_a_hand_loop_over_masked_positions(toks):
    tok = toks["bert"]
    model = _model("bert", tok)
    mask_id = tok.special_token_ids()["mask_token_id"]
    pair = {"row": 1, "sent_more": "The young pilot checked the map twice.",
            "sent_less": "The old pilot checked the map.", "direction": "stereo", "bias_type": "x"}
    more, less = tok.encode(pair["sent_more"]), tok.encode(pair["sent_less"])
    assert len(more) != len(less)  # so that the batch below is padded
    every = [[p for p in range(1, len(ids) - 1)] for ids in (more, less)]
    with torch.no_grad():
        hand = [_hand_pll(lambda x: model(x).logits, ids, pos, mask_id) for ids, pos in zip((more, less), every)]
    got = bp.pseudo_log_likelihoods(model, [more, less], every, mask_id, tok.pad_id, batch_size=5)
    assert got == pytest.approx(hand, abs=1e-4)

    # score_pairs: only the shared tokens, never [CLS]/[SEP]; "all": every token but the specials
    shared = bp.shared_positions(more, less, {tok.special_token_ids()["cls_token_id"],
                                              tok.special_token_ids()["sep_token_id"]})
    assert 0 < len(shared[0]) == len(shared[1]) < len(every[0])
    assert [more[p] for p in shared[0]] == [less[p] for p in shared[1]]
    with torch.no_grad():
        hand_shared = [_hand_pll(lambda x: model(x).logits, ids, pos, mask_id) for ids, pos in zip((more, less), shared)]
    scored = bp.score_pairs(model, tok, [pair], batch_size=4)[0]
    assert [scored["sent_more_score"], scored["sent_less_score"]] == pytest.approx(hand_shared, abs=1e-4)
    assert scored["scored_tokens"] == [len(shared[0])] * 2
    full = bp.score_pairs(model, tok, [pair], tokens="all")[0]
    assert [full["sent_more_score"], full["sent_less_score"]] == pytest.approx(hand, abs=1e-4)


def test_pseudo_log_likelihood_matches_transformers_bert_for_masked_lm():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tf = importlib.import_module("transformers")
    torch.manual_seed(0)
    hf = tf.BertForMaskedLM(tf.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, max_position_embeddings=64)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours = lmforge.from_hf(hf).eval()
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(5, 97, (n,), generator=g).tolist() for n in (9, 6, 4)]
    positions = [list(range(1, len(r) - 1)) for r in rows]
    with torch.no_grad():
        hand = [_hand_pll(lambda x: hf(input_ids=x).logits, r, pos, 3) for r, pos in zip(rows, positions)]
    got = bp.pseudo_log_likelihoods(ours, rows, positions, mask_id=3, pad_id=0, batch_size=4)  # padded batches
    assert got == pytest.approx(hand, abs=1e-4)


def test_decoder_log_likelihood_equals_summed_log_softmax(toks):
    tok = toks["gpt"]
    model = _model("gpt", tok)
    pairs = bp.read_pairs(FIXTURE)[:3]
    for tokens in ("all", "shared"):
        scored = bp.score_pairs(model, tok, pairs, tokens=tokens, batch_size=4)  # 6 sentences: two padded batches
        for pair, got in zip(pairs, scored):
            more, less = (bp.encode_sentence(model, tok, pair[k]) for k in ("sent_more", "sent_less"))
            assert more[0] == tok.special_token_ids().get("bos_token_id", tok.special_token_ids()["eos_token_id"])
            if tokens == "all":
                positions = [range(1, len(more)), range(1, len(less))]
            else:
                positions = [[p for p in at if p >= 1] for at in bp.shared_positions(more, less, {more[0]})]
                assert len(positions[0]) < len(more) - 1
            for ids, pos, value in zip((more, less), positions, (got["sent_more_score"], got["sent_less_score"])):
                with torch.no_grad():
                    logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)  # (T, V)
                assert value == pytest.approx(sum(float(logp[p - 1, ids[p]]) for p in pos), abs=1e-4)


def test_metric_equals_a_hand_count_per_category():
    canned = [  # (bias_type, direction, sent_more score, sent_less score)
        ("age", "stereo", -3.0, -4.0), ("age", "stereo", -5.0, -4.0), ("age", "antistereo", -2.0, -6.0),
        ("region", "antistereo", -7.0, -1.0), ("region", "stereo", -2.0001, -2.0004),  # equal at 3 decimals
        ("region", "stereo", -1.0, -9.0), ("height", "antistereo", -4.0, -4.5),
    ]
    scored = [{"bias_type": t, "direction": d, "sent_more_score": m, "sent_less_score": s} for t, d, m, s in canned]
    summary = bp.summarize(scored)
    for name in ("age", "region", "height"):
        rows = [c for c in canned if c[0] == name]
        preferred = sum(round(m, 3) > round(s, 3) for _, _, m, s in rows)
        ties = sum(round(m, 3) == round(s, 3) for _, _, m, s in rows)
        assert summary["by_type"][name] == {"pairs": len(rows), "preferred": preferred, "ties": ties,
                                            "share": preferred / len(rows)}
    assert summary["by_type"]["age"]["preferred"] == 2 and summary["by_type"]["region"]["ties"] == 1
    assert summary["all"] == {"pairs": 7, "preferred": 4, "ties": 1, "share": 4 / 7}
    # antistereo rows count when sent_more (the stereotyping sentence) wins, exactly as stereo rows do
    assert summary["by_direction"]["antistereo"] == {"pairs": 3, "preferred": 2, "ties": 0, "share": 2 / 3}
    assert summary["by_direction"]["stereo"]["preferred"] == 2
    text = bp.table(summary)
    assert text.splitlines()[-1].split() == ["all", "pairs", "0.571", "4", "1", "7"]


def test_probe_bias_cli_on_the_fixture(toks, tmp_path, capsys):
    folder = checkpoint.save(_model("bert", toks["bert"]), tmp_path / "bert", tokenizer=toks["bert"])
    assert main(["probe", "bias", "--model", str(folder), "--pairs", str(FIXTURE), "--out", str(tmp_path / "b"),
                 "--batch-size", "7"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    last = json.loads(lines[-1])
    assert last["scoring"] == "pseudo-log-likelihood" and last["all"]["pairs"] == 6
    assert set(last["by_type"]) == {"illustrative-height", "illustrative-region", "illustrative-age",
                                    "illustrative-handedness"}
    assert lines[0].split()[:2] == ["bias_type", "share"] and any(line.startswith("all pairs") for line in lines)
    saved = json.loads((tmp_path / "b" / "results.json").read_text())
    assert saved == last
    pairs = [json.loads(line) for line in (tmp_path / "b" / "pairs.jsonl").read_text().splitlines()]
    assert [p["row"] for p in pairs] == list(range(1, 7))
    model, tok = checkpoint.load_body(folder)
    assert pairs == bp.score_pairs(model, tok, bp.read_pairs(FIXTURE))
    assert sum(p["preferred"] == "sent_more" for p in pairs) == last["all"]["preferred"]

    gpt = checkpoint.save(_model("gpt", toks["gpt"]), tmp_path / "gpt", tokenizer=toks["gpt"])
    assert main(["probe", "bias", "--model", str(gpt), "--pairs", str(FIXTURE), "--tokens", "all"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["scoring"] == "log-likelihood" and last["tokens"] == "all" and last["all"]["pairs"] == 6


def _write(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def test_bad_pair_files_are_refused_in_one_line(toks, tmp_path, capsys):
    folder = checkpoint.save(_model("bert", toks["bert"]), tmp_path / "bert", tokenizer=toks["bert"])
    header = list(bp.COLUMNS)
    ok = ["The tall man ran.", "The short man ran.", "stereo", "height"]
    cases = {
        "missing.csv": (["sent_more", "sent_less", "bias_type"], [ok[:2] + ok[3:]],
                        "missing.csv: no column(s) stereo_antistereo"),
        "empty.csv": (header, [ok, ["", "The short man ran.", "stereo", "height"]],
                      "empty.csv: row 2 (line 3): sent_more is empty"),
        "same.csv": (header, [ok, ok, ["The man ran.", "The man ran.", "antistereo", "x"]],
                     "same.csv: row 3 (line 4): sent_more and sent_less are the same sentence"),
        "direction.csv": (header, [[*ok[:2], "pro", "height"]],
                          "direction.csv: row 1 (line 2): stereo_antistereo is 'pro'; expected stereo or antistereo"),
    }
    for name, (columns, rows, message) in cases.items():
        path = _write(tmp_path / name, columns, rows)
        with pytest.raises(UserInputError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
            bp.read_pairs(path)
        assert main(["probe", "bias", "--model", str(folder), "--pairs", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
    any_type = _write(tmp_path / "any.csv", header, [[*ok[:3], "a type of my own"]])
    assert bp.read_pairs(any_type)[0]["bias_type"] == "a type of my own"
    assert main(["probe", "bias", "--model", str(folder), "--pairs", str(tmp_path / "nope.csv")]) == 2
    assert f"{tmp_path / 'nope.csv'}: no such data file" in capsys.readouterr().err
    assert main(["probe", "bias", "--model", str(folder)]) == 2
    assert "probe bias needs --pairs FILE" in capsys.readouterr().err


def test_encoder_decoders_and_headless_encoders_are_refused(tmp_path):
    t5_tok = th.tokenizer(tmp_path, "t5")
    pairs = [{"row": 1, "sent_more": "john lives in paris", "sent_less": "mary lives in paris",
              "direction": "stereo", "bias_type": "x"}]
    with pytest.raises(UserInputError, match=r"^probe bias scores encoders with an MLM head .* this model is an "
                                             r"encoder-decoder"):
        bp.score_pairs(th.body("t5", t5_tok), t5_tok, pairs)
    bert_tok = th.tokenizer(tmp_path, "bert")
    with pytest.raises(UserInputError, match="this model is an encoder with head='none'"):
        bp.score_pairs(th.body("bert", bert_tok, head="none"), bert_tok, pairs)
    long = [{**pairs[0], "row": 4, "sent_more": "john lives in paris " * 20}]
    with pytest.raises(UserInputError, match=r"^pairs.csv: row 4: \d+ tokens, more than the model's max_seq_len 64"):
        bp.score_pairs(th.body("bert", bert_tok), bert_tok, long, where="pairs.csv")
