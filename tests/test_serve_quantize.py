"""``lmforge serve --quantize/--dtype``: a quantised server answers chat with the greedy tokens ``lmforge generate``
gives under the same flags, a folder written by ``lmforge quantize`` serves as saved, and a bad value is one line."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

import serve_helpers as sh  # noqa: E402
from lmforge.cli.main import main  # noqa: E402
from lmforge.models.quantize import quantization_of, quantize_model, save_quantized  # noqa: E402
from lmforge.prompting.instruct import ChatTemplate  # noqa: E402
from lmforge.tokenization import Tokenizer  # noqa: E402

import lmforge  # noqa: E402

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "where is the cat"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_quantize")
    fp32 = sh.gpt_folder(root / "fp32")
    model = lmforge.load(fp32)
    quantize_model(model, "int8")
    saved = save_quantized(model, root / "int8", tokenizer=Tokenizer.load(fp32))
    ChatTemplate().save(saved)
    return {"fp32": fp32, "int8": saved}


@pytest.fixture(scope="module")
def server(folders):
    s = sh.Server("--model", f"gpt={folders['fp32']}", "--quantize", "int8")
    yield s
    s.stop()


def _chat(url: str, model: str = "gpt"):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0)


def test_quantized_server_chat_equals_lmforge_generate_quantize_int8(server, folders, capsys):
    tok = Tokenizer.load(folders["fp32"])
    template = ChatTemplate.load(folders["fp32"])
    prompt = "".join(text for text, _ in template.render(MESSAGES, add_generation_prompt=True))
    # the CLI encodes the rendered text whole; the server encodes it piece by piece: the same ids here
    assert tok.encode(prompt, add_special_tokens=False) == template.encode(tok, MESSAGES, True)[0]
    stop = template.user.split("{content}", 1)[0]
    assert main(["generate", "--model", str(folders["fp32"]), "--prompt", prompt, "--max-new-tokens", "12",
                 "--stop", stop, "--quantize", "int8"]) == 0
    expected = capsys.readouterr().out[:-1]  # the CLI ends with a newline
    chat = _chat(server.url)
    assert chat.choices[0].message.content == expected and chat.usage.completion_tokens > 0


def test_saved_quantized_folder_serves_as_saved(server, folders):
    thread = sh.ThreadServer({"q8": folders["int8"]})
    try:
        assert quantization_of(thread.served["q8"].model)["mode"] == "int8"
        assert _chat(thread.url, "q8").choices[0].message.content == _chat(server.url).choices[0].message.content
    finally:
        thread.stop()


def test_startup_line_names_what_the_flags_loaded(folders):
    s = sh.Server("--model", f"a={folders['fp32']}", "--model", f"b={folders['int8']}", "--quantize", "int4",
                  "--dtype", "bf16")
    out = s.stop()
    # the fp32 folder is quantised at load; the int8 folder keeps its own quantisation (int4 does not apply)
    assert "a (generate, chat, int4, bf16), b (generate, chat, int8, bf16) on http://" in out


@pytest.mark.parametrize("flag, value", [("--quantize", "int3"), ("--dtype", "fp16")])
def test_bad_precision_value_is_one_error_line(folders, capsys, flag, value):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--model", str(folders["fp32"]), flag, value])
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(f"lmforge serve: error: argument {flag}")
    assert f"invalid choice: '{value}'" in errors[0]
