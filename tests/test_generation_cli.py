"""``lmforge generate`` and text streaming on a tiny model folder with a real (tiny) tokenizer."""

from __future__ import annotations

import pytest
import torch

import lmforge
from lmforge.cli.main import main
from lmforge.generation import TextStream, generate_text, stream
from lmforge.tokenization import Tokenizer, train_tokenizer

TEXT = "the cat sat on the mat. the dog sat on the log. snow ☃ falls on the café.\n\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    (root / "corpus.txt").write_text(TEXT * 40, encoding="utf-8")
    tok = train_tokenizer([root / "corpus.txt"], kind="byte-bpe", vocab_size=300, family="gpt", show_progress=False)
    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny", vocab_size=len(tok), d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                max_seq_len=128, **{k: v for k, v in tok.special_token_ids().items()
                                                    if k.endswith("_token_id")})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return lmforge.save(model, root / "model", tokenizer=tok)


def _cli(capsys, folder, *args) -> str:
    assert main(["generate", "--model", str(folder), *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("settings", [[], ["--strategy", "sample", "--top-p", "0.9", "--seed", "3"],
                                      ["--repetition-penalty", "1.3", "--no-repeat-ngram-size", "2"]])
def test_streamed_output_equals_batch_output(capsys, folder, settings):
    args = ["--prompt", "the cat", "--max-new-tokens", "12", "--ignore-eos", *settings]
    streamed = _cli(capsys, folder, *args)
    printed = _cli(capsys, folder, *args, "--no-stream")
    assert streamed == printed and len(streamed.strip()) > 0


def test_cli_prints_what_generate_text_returns(capsys, folder, tmp_path):
    model, tok = lmforge.load(folder), Tokenizer.load(folder)
    expected = generate_text(model, tok, ["the dog", "snow"], max_new_tokens=8, num_beams=3, num_return_sequences=2,
                             ignore_eos=True)
    (tmp_path / "p.txt").write_text("snow", encoding="utf-8")
    out = _cli(capsys, folder, "--prompt", "the dog", "--prompt-file", str(tmp_path / "p.txt"), "--max-new-tokens",
               "8", "--strategy", "beam", "--num-beams", "3", "--num-return-sequences", "2", "--ignore-eos")
    blocks = out.split("==> prompt ")[1:]
    assert [b.split(" <==\n", 1)[1].removesuffix("\n") for b in blocks] == expected
    assert blocks[3].startswith("2, output 2")


def test_stream_pieces_join_to_the_generated_text(folder):
    model, tok = lmforge.load(folder), Tokenizer.load(folder)
    for seed in range(3):  # a hot random model emits stray bytes: the held-back tail must still come out
        settings = dict(max_new_tokens=16, ignore_eos=True, strategy="sample", temperature=2.0, seed=seed)
        pieces = list(stream(model, tok, "snow", **settings))
        assert "".join(pieces) == generate_text(model, tok, "snow", **settings)[0]


def test_text_stream_holds_back_split_characters():
    text = TextStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    pieces = [text.push(b) for b in "né ☃!".encode()]
    assert pieces == ["n", "", "é", " ", "", "", "☃", "!"]
    assert text.flush() == ""
    text.push(0xE2)  # an incomplete character at the very end comes out at the flush
    assert text.flush() == "\ufffd"


def test_stop_string_cuts_the_streamed_text(capsys, folder):
    full = _cli(capsys, folder, "--prompt", "the", "--max-new-tokens", "20", "--ignore-eos").rstrip("\n")
    stop = full[4:6]
    out = _cli(capsys, folder, "--prompt", "the", "--max-new-tokens", "20", "--ignore-eos", "--stop", stop)
    assert out.rstrip("\n") == full[: full.find(stop) + len(stop)]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "x", "--top-p", "2"], "top_p"),
        (["--prompt", "x", "--strategy", "sample", "--num-beams", "2"], "num_beams"),
        ([], "give a prompt"),
    ],
)
def test_user_errors_are_one_line_exit_2(capsys, folder, args, message):
    assert main(["generate", "--model", str(folder), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_missing_folder_or_tokenizer_is_exit_2(capsys, tmp_path):
    assert main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    assert "not a model folder" in capsys.readouterr().err
    lmforge.save(lmforge.build_model("gpt-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=32), tmp_path / "bare")
    assert main(["generate", "--model", str(tmp_path / "bare"), "--prompt", "x"]) == 2
    assert "no tokenizer.json" in capsys.readouterr().err
