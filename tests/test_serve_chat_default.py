"""Chat with a decoder that was never instruction-tuned (no ``chat_template.json``, as ``lmforge pretrain``
leaves it): serve and ``lmforge chat`` render the plain default template, ``User: ...`` / ``Assistant:`` lines,
and say so; the server answers /favicon.ico. The answers are checked against lmforge's own greedy ``generate``
on the hand-written prompt text, so the template is the one named, not merely "something that runs"."""

from __future__ import annotations

import io
import json
import shutil
import sys
import urllib.request
import xml.etree.ElementTree as ET

import pytest

import lmforge
import serve_helpers as sh
from lmforge.cli.main import main
from lmforge.generation import generate
from lmforge.serve.batching.job import visible_text
from lmforge.tokenization import Tokenizer

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-default")
    sft = sh.gpt_folder(root / "sft")  # with a chat template: instruction-tuned
    base = root / "base"
    shutil.copytree(sft, base)
    (base / "chat_template.json").unlink()
    return {"base": base, "sft": sft}


@pytest.fixture(scope="module")
def server(folders):
    s = sh.ThreadServer({"base": folders["base"], "sft": folders["sft"]})
    yield s
    s.stop()


def _greedy(folder, prompt_text: str, n: int) -> str:
    """What the model says after ``prompt_text`` (greedy, ``n`` tokens), cut at the default user header."""
    model, tok = lmforge.load(folder).eval(), Tokenizer.load(folder)
    ids = tok.encode(prompt_text, add_special_tokens=False)
    text = tok.decode(generate(model, [ids], max_new_tokens=n).tolist()[0])
    return visible_text(text, ["User: "])[0] if "User: " in text else text


def test_models_name_the_default_template(server):
    with urllib.request.urlopen(server.url + "/v1/models") as r:
        cards = {m["id"]: m for m in json.loads(r.read())["data"]}
    assert (cards["base"]["chat"], cards["base"]["chat_template"]) == (False, "default")
    assert (cards["sft"]["chat"], cards["sft"]["chat_template"]) == (True, "model")


def test_openai_client_chats_with_a_base_decoder_through_the_default_template(server, folders):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "where is the cat"}]
    chat = client.chat.completions.create(model="base", messages=msgs, max_tokens=6, temperature=0)
    prompt = "System: be brief\nUser: where is the cat\nAssistant:"  # the template, written out by hand
    tok = Tokenizer.load(folders["base"])
    assert chat.usage.prompt_tokens == len(tok.encode(prompt, add_special_tokens=False))
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == _greedy(folders["base"], prompt, 6)
    pieces = [c.choices[0].delta.content or "" for c in
              client.chat.completions.create(model="base", messages=msgs, max_tokens=6, temperature=0, stream=True)
              if c.choices]
    assert "".join(pieces) == chat.choices[0].message.content


def test_favicon_is_an_svg(server):
    with urllib.request.urlopen(server.url + "/favicon.ico") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("image/svg+xml")
        assert ET.fromstring(r.read()).tag == "{http://www.w3.org/2000/svg}svg"


def test_cli_chat_on_a_base_decoder_says_so_once_and_answers(folders, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\nwhere is the cat\n"))
    assert main(["chat", "--model", str(folders["base"]), "--temperature", "0", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr()
    notices = [line for line in out.err.splitlines() if "not instruction-tuned" in line]
    assert len(notices) == 1 and "default template" in notices[0]
    a1 = _greedy(folders["base"], "User: hello\nAssistant:", 4)
    a2 = _greedy(folders["base"], f"User: hello\nAssistant:{a1}\nUser: where is the cat\nAssistant:", 4)
    assert out.out == a1 + "\n" + a2 + "\n"


def test_cli_chat_on_an_instruction_tuned_decoder_gives_no_notice(folders, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(["chat", "--model", str(folders["sft"]), "--temperature", "0", "--max-new-tokens", "2"]) == 0
    assert "not instruction-tuned" not in capsys.readouterr().err
