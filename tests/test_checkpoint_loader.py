"""checkpoint.load: one loader for a preset name, an lmforge folder, a Hugging Face folder and a biLM folder."""

from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge import checkpoint
from lmforge.models.bilstm_lm import BiLM, BiLMConfig

transformers = pytest.importorskip("transformers")


def test_a_preset_name_gives_fresh_weights():
    assert isinstance(checkpoint.load("gpt-tiny"), lmforge.Transformer)
    assert isinstance(checkpoint.load("elmo-tiny"), BiLM)


def test_an_lmforge_folder_round_trips(tmp_path):
    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=50)
    loaded = checkpoint.load(model.save(tmp_path / "gpt"))
    assert not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_a_bilm_folder_loads_as_a_bilm(tmp_path):
    model = BiLM(BiLMConfig(vocab_size=30, d_embed=8, d_hidden=8, n_layers=1))
    folder = checkpoint.save(model, tmp_path / "elmo")
    assert checkpoint.is_bilm(folder) and not checkpoint.is_hf_folder(folder)
    loaded = checkpoint.load(folder)
    assert isinstance(loaded, BiLM)
    assert torch.equal(loaded.embed_tokens.weight, model.embed_tokens.weight)


def test_a_hugging_face_folder_loads_through_the_same_door(tmp_path):
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32)).eval()
    hf.save_pretrained(tmp_path / "hf")
    assert checkpoint.is_hf_folder(tmp_path / "hf")
    model = checkpoint.load(tmp_path / "hf")
    ids = torch.randint(0, 50, (2, 6))
    torch.testing.assert_close(model(ids).logits, hf(ids).logits, atol=1e-4, rtol=1e-4)
    body, tok = checkpoint.read_model_folder(tmp_path / "hf", with_tokenizer=True)
    assert isinstance(body, lmforge.Transformer) and tok is None  # the folder holds no tokenizer


def test_loading_a_folder_and_decoding_never_import_the_compiler(tmp_path):
    """A folder is loaded by building the model on the meta device; torch's normal_ on a meta tensor imports
    torch._dynamo (seconds of every fresh ``lmforge generate``), so the constructors must not call it there."""
    import subprocess
    import sys

    shapes = {"gpt-tiny": {}, "bert-tiny": {}, "t5-tiny": {}, "deberta-tiny": {}, "bart-tiny": {}, "llama-tiny": {},
              "mixtral-tiny": {},
              "sinusoidal": {"position": "sinusoidal", "step_embeddings": True, "share_layers": True},
              "alibi": {"position": "alibi"}}
    folders = [str(lmforge.build_model(name if name.endswith("-tiny") else "gpt-tiny", max_seq_len=64, **extra)
                   .save(tmp_path / name)) for name, extra in shapes.items()]
    code = ("import sys, torch, lmforge\n"
            f"models = [lmforge.load(f) for f in {folders!r}]\n"
            "models[0].generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3)\n"
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
