"""`lmforge finetune --baseline bilstm|bilstm-tagger --features elmo=BILM_DIR`: ELMo in a task model (Peters 2018).

The word-level ELMo vector equals the paper's eq. 1 computed by hand (softmax(s)-weighted layers times gamma, a
word's pieces averaged); gradients reach s and gamma but never the frozen biLM; bad --features values are refused
in one line that says what the folder is; a tiny biLM trained here feeds a classifier and a tagger whose task
folders save, reload (from the biLM path and sha256 they record) and predict exactly as the trained models did.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from lmforge.checkpoint import load_bilm, save
from lmforge.cli.main import main
from lmforge.errors import UserInputError
from lmforge.evaluation import baselines, task_baselines
from lmforge.evaluation.bilstm_classifier import BiLSTMClassifier
from lmforge.evaluation.elmo_features import ElmoFeatures, WithFeatures, parse_features
from lmforge.models.bilstm_lm import BiLM, BiLMConfig
from lmforge.objectives.bilm import BiLMObjective
from lmforge.tasks.data import Table, read_table
from lmforge.tasks.spec import TaskSpec
from lmforge.tokenization import train_tokenizer
from lmforge.training.config import TrainConfig
from lmforge.utils.manifest import sha256_file

NER = Path(__file__).parent / "fixtures" / "tiny_ner.conll"
SENTENCES = ["a good film", "a bad film", "John lives in Paris", "Mary visited London today", "what a great movie",
             "an awful and boring movie", "the plot was good", "the acting was bad"]
REVIEWS = [("a good and moving film", "1"), ("a bad and boring film", "0"), ("great acting", "1"),
           ("awful plot", "0"), ("the best movie this year", "1"), ("the worst movie this year", "0")] * 3


@pytest.fixture(scope="module")
def bilm_dir(tmp_path_factory) -> Path:
    """A biLM folder as `pretrain --objective bilm` writes it (config, weights, tokenizer), trained for 20 steps."""
    root = tmp_path_factory.mktemp("bilm")
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(SENTENCES * 10) + "\n")
    tok = train_tokenizer([corpus], kind="wordpiece", family="bert", vocab_size=90, show_progress=False)
    torch.manual_seed(0)
    bilm = BiLM(BiLMConfig(vocab_size=tok.vocab_size, d_embed=12, d_hidden=12, n_layers=2, dropout=0.1,
                           pad_token_id=tok.pad_id, max_seq_len=64))
    ids = tok.special_token_ids()
    objective = BiLMObjective(pad_token_id=tok.pad_id, cls_token_id=ids["cls_token_id"],
                              sep_token_id=ids["sep_token_id"])
    data = [tok.encode(s, add_special_tokens=False) for s in SENTENCES]
    opt = torch.optim.Adam(bilm.parameters(), lr=1e-2)
    for _ in range(20):
        opt.zero_grad()
        bilm(**objective(data)).loss.backward()
        opt.step()
    return save(bilm.eval(), root / "model", tokenizer=tok)


def _config(**kw) -> TrainConfig:
    return TrainConfig(**{**baselines.NEURAL_DEFAULTS, "progress": False, "tensorboard": False, "eval_every": 0,
                          "save_every": 0, **kw})


# ------------------------------------------------------------------------------------------- the mix
def test_elmo_vectors_equal_eq_1_by_hand_with_pieces_averaged_per_word(bilm_dir):
    elmo = ElmoFeatures.from_folder(bilm_dir)
    with torch.no_grad():
        elmo.mix.scalars.copy_(torch.tensor([0.3, -1.0, 2.0]))
        elmo.mix.gamma.fill_(1.7)
    sentences = [["Paris", "visited", "zzq"], ["a", "film"]]  # "visited", "zzq": several pieces each
    examples = [elmo.pieces(s) for s in sentences]
    assert any(e["elmo_words"].count(1) > 1 for e in examples[:1])  # a word split into pieces is exercised
    batch = elmo.collate(examples)
    got = elmo(**batch, n_words=3)  # (B, T, D), T = the longest sentence's words

    exp = [math.exp(v) for v in (0.3, -1.0, 2.0)]
    weights = [v / sum(exp) for v in exp]
    bilm = load_bilm(bilm_dir)
    for b, (sentence, example) in enumerate(zip(sentences, examples)):
        ids = torch.tensor([example["elmo_ids"]])
        layers = bilm.layer_states(ids)  # each sentence alone, unpadded
        for w in range(len(sentence)):
            at = [t for t, k in enumerate(example["elmo_words"]) if k == w]
            word = [layer[0, at].mean(0) for layer in layers]  # (D,) per layer: the mean of the word's pieces
            want = 1.7 * sum(wt * h for wt, h in zip(weights, word))
            torch.testing.assert_close(got[b, w], want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[1, 2], torch.zeros(elmo.dim))  # a padding word has no pieces: zeros


def test_gradients_reach_s_and_gamma_but_not_the_frozen_bilm(bilm_dir):
    elmo = ElmoFeatures.from_folder(bilm_dir)
    torch.manual_seed(0)
    model = WithFeatures(BiLSTMClassifier(20, 2, embed_dim=4, hidden=5, feature_dim=elmo.dim), elmo).train()
    assert not elmo.bilm.training  # model.train() does not reach the biLM: no dropout in its features
    assert {n for n, _ in model.named_parameters()} >= {"elmo.mix.scalars", "elmo.mix.gamma"}
    assert not any(n.startswith("elmo.bilm") for n in model.state_dict())  # its weights stay in its folder
    assert not any(p is q for p in model.parameters() for q in elmo.bilm.parameters())
    batch = elmo.collate([elmo.pieces(["a", "good", "film"]), elmo.pieces(["bad"])])
    out = model(torch.tensor([[2, 3, 4], [5, 0, 0]]), torch.tensor([1, 0]), **batch)
    out.loss.backward()
    assert elmo.mix.scalars.grad is not None and elmo.mix.scalars.grad.abs().sum() > 0
    assert elmo.mix.gamma.grad is not None and elmo.mix.gamma.grad.abs() > 0
    assert all(p.grad is None and not p.requires_grad for p in elmo.bilm.parameters())


# ------------------------------------------------------------------------------------------- refusals
def test_unknown_kinds_and_malformed_values_are_one_line_listing_the_kinds():
    for bad, said in (["bert=runs/bert"], "unknown feature kind 'bert'"), (["elmo"], "expected KIND=PATH"):
        with pytest.raises(UserInputError, match=said) as exc:
            parse_features(bad)
        assert "kinds: elmo=BILM_DIR" in str(exc.value) and "\n" not in str(exc.value)


def test_cli_refuses_what_is_not_a_bilm_folder_saying_what_it_is(bilm_dir, tmp_path, capsys):
    data = tmp_path / "train.tsv"
    data.write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in REVIEWS))
    gpt = save(__import__("lmforge").build_model("gpt-tiny", n_layers=1, d_model=16, n_heads=2, d_ff=32,
                                                 vocab_size=64), tmp_path / "gpt")
    (tmp_path / "empty").mkdir()
    base = ["finetune", "--baseline", "bilstm", "--task", "classify", "--train", str(data), "--out"]
    cases = [(["--features", f"elmo={gpt}"], f"--features elmo={gpt} is a model folder, not an ELMo biLM folder"),
             (["--features", f"elmo={tmp_path / 'empty'}"], "empty: not an ELMo biLM folder"),
             (["--features", f"elmo={tmp_path / 'nowhere'}"], "no such folder"),
             (["--features", "bert=x"], "unknown feature kind 'bert'; kinds: elmo=BILM_DIR")]
    for i, (extra, said) in enumerate(cases):
        out = tmp_path / f"run{i}"
        assert main([*base, str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
        assert not out.exists()  # a refused command writes nothing
    # features need a word baseline to sit beside
    assert main(["finetune", "--baseline", "cnn", "--task", "classify", "--train", str(data), "--out",
                 str(tmp_path / "cnn"), "--features", f"elmo={bilm_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use --baseline bilstm or bilstm-tagger" in err
    assert main(["finetune", "--model", "gpt-tiny", "--task", "classify", "--train", str(data), "--out",
                 str(tmp_path / "gpt-run"), "--features", f"elmo={bilm_dir}"]) == 2
    assert "use it with --baseline bilstm or bilstm-tagger" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- end to end
@pytest.fixture
def trained(monkeypatch):
    """What the Trainer trained, as it was at the end (spied from the trainers' save_model)."""
    live = {}
    for cls, attr in ((baselines.BaselineTrainer, "baseline"), (task_baselines.TaggerTrainer, "tagger")):
        original = cls.save_model

        def spy(self, original=original, attr=attr):
            live["model"] = getattr(self, attr)
            return original(self)

        monkeypatch.setattr(cls, "save_model", spy)
    return live


def test_classifier_with_elmo_trains_saves_and_reloads_to_identical_predictions(bilm_dir, tmp_path, trained):
    bilm_copy = tmp_path / "bilm"
    shutil.copytree(bilm_dir, bilm_copy)
    table = Table("toy", [{"text": t, "label": y} for t, y in REVIEWS], ["text", "label"])
    run = baselines.train_baseline("bilstm", TaskSpec(task="classify"), table, table, out=tmp_path / "run",
                                   config=_config(max_steps=8, batch_size=6, lr=1e-2),
                                   options=baselines.BaselineOptions(embed_dim=8, hidden=8),
                                   features={"elmo": str(bilm_copy)})
    meta = json.loads((Path(run["model_dir"]) / "task.json").read_text())
    record = meta["features"]["elmo"]
    assert record["path"] == str(bilm_copy.resolve())
    assert record["sha256"] == sha256_file(bilm_copy / "model.safetensors") and record["config"]["n_layers"] == 2

    live = trained["model"]
    mix = live.elmo.mix
    assert mix.scalars.abs().sum() > 0 and mix.gamma != 1  # the mix was learned with the task
    fresh = load_bilm(bilm_copy)  # and the biLM was not: its weights are those in its folder
    assert all(torch.equal(a, b) for a, b in zip(live.elmo.bilm.state_dict().values(), fresh.state_dict().values()))

    texts = [t for t, _ in REVIEWS[:6]] + ["an unseen Review", "!"]
    reloaded = baselines.load_baseline(run["model_dir"])
    assert reloaded.elmo is not None and reloaded.elmo.source["path"] == str(bilm_copy.resolve())
    assert (live.scores(texts) == reloaded.scores(texts)).all()
    rows = baselines.predict(run["model_dir"], Table("new", [{"text": t} for t in texts], ["text"]))
    assert [r["prediction"] for r in rows] == [live.spec.labels[k] for k in live.scores(texts).argmax(1)]

    # the task folder reads the biLM from the path it recorded: changed or moved, it is refused in one line
    weights = bilm_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(UserInputError, match="changed since the task was trained"):
        baselines.load_baseline(run["model_dir"])
    shutil.rmtree(bilm_copy)
    with pytest.raises(FileNotFoundError, match="not there any more"):
        baselines.evaluate(run["model_dir"], table)


def test_tagger_with_elmo_from_the_cli_reloads_in_predict_to_identical_tags(bilm_dir, tmp_path, trained, capsys):
    out = tmp_path / "run"
    assert main(["finetune", "--baseline", "bilstm-tagger", "--task", "tag", "--train", str(NER), "--eval", str(NER),
                 "--out", str(out), "--features", f"elmo={bilm_dir}", "--max-steps", "6", "--batch-size", "4",
                 "--baseline-option", "embed_dim=8", "--baseline-option", "hidden=8"]) == 0
    assert "ELMo from" in capsys.readouterr().err
    live = trained["model"]
    assert isinstance(live, WithFeatures) and not live.elmo.bilm.training
    assert main(["predict", "--model", str(out / "model"), "--data", str(NER), "--output",
                 str(tmp_path / "pred.jsonl")]) == 0
    predicted = [json.loads(line)["prediction"] for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    loaded = task_baselines.Loaded(out / "model")
    loaded.model = live.eval()  # the same sentences through the model as it ended training
    sentences = [r["tokens"] for r in read_table(NER).rows]
    assert predicted == loaded._tag(sentences)
    assert main(["evaluate", "--model", str(out / "model"), "--data", str(NER)]) == 0
