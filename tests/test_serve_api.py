"""``lmforge serve`` end to end: a live server subprocess on loopback, driven by the official ``openai`` client
and by plain HTTP. Continuous batching must not change greedy tokens (a request in a busy batch equals the
same request alone, and ``lmforge generate``); limits answer 400/401/429/503 as documented; a client that
goes away frees its row; SIGTERM drains."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

import serve_helpers as sh  # noqa: E402
from lmforge.cli.main import main  # noqa: E402

KEY = "test-key-123"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    return {"gpt": sh.gpt_folder(root / "gpt"), "enc": sh.encoder_folder(root / "enc"),
            # wider and longer: generations that last seconds, for the queue, disconnect and drain tests
            "slow": sh.gpt_folder(root / "slow", max_seq_len=1024, n_layers=4, d_model=256, n_heads=4, d_ff=1024)}


@pytest.fixture(scope="module")
def server(folders):
    s = sh.Server("--model", f"gpt={folders['gpt']}", "--model", f"enc={folders['enc']}")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def small_server(folders):
    """One row, one queue place, an API key from the environment."""
    s = sh.Server("--model", f"slow={folders['slow']}", "--max-batch", "1", "--max-queue", "1",
                  extra_env={"LMFORGE_API_KEY": KEY})
    yield s
    s.stop()


def post(url: str, path: str, body, key: str | None = None, raw: bytes | None = None):
    """(status, headers, parsed JSON body) of a POST."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + path, data=raw if raw is not None else json.dumps(body).encode(),
                                 headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read() or b"{}")


def complete(url: str, prompt: str, n: int, model: str = "gpt", key: str | None = None) -> str:
    status, _, body = post(url, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": n,
                                                    "temperature": 0}, key)
    assert status == 200, body
    return body["choices"][0]["text"]


def test_openai_client_models_completions_chat_stream_and_embeddings(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert {m.id for m in client.models.list()} == {"gpt", "enc"}

    out = client.completions.create(model="gpt", prompt="the cat sat", max_tokens=6, temperature=0, logprobs=2)
    assert out.choices[0].finish_reason in ("length", "stop") and out.usage.prompt_tokens > 0
    assert out.usage.completion_tokens == len(out.choices[0].logprobs.token_logprobs) <= 6
    assert all(lp <= 0 for lp in out.choices[0].logprobs.token_logprobs)

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "where is the cat"}]
    chat = client.chat.completions.create(model="gpt", messages=msgs, max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.usage.total_tokens > 8 - 1

    pieces = [c.choices[0].delta.content or "" for c in
              client.chat.completions.create(model="gpt", messages=msgs, max_tokens=8, temperature=0, stream=True)
              if c.choices]
    assert "".join(pieces) == chat.choices[0].message.content  # streaming joins to the same greedy answer

    emb = client.embeddings.create(model="enc", input=["a cat sat on the mat", "paris"])  # base64 by default
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 32
    floats = client.embeddings.create(model="enc", input="paris", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(emb.data[1].embedding, abs=1e-6)


def test_greedy_text_equals_lmforge_generate(server, folders, capsys):
    prompt = "the dog ran to a big house"
    assert main(["generate", "--model", str(folders["gpt"]), "--prompt", prompt, "--max-new-tokens", "20"]) == 0
    assert complete(server.url, prompt, 20) == capsys.readouterr().out[:-1]  # the CLI ends with a newline


def test_sixteen_concurrent_greedy_requests_each_equal_their_solo_result(server):
    rng = random.Random(0)
    words = "the cat dog sat on mat log ran to a big small red house river john mary paris".split()
    jobs = [(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))), rng.randint(1, 40)) for _ in range(16)]
    solo = [complete(server.url, p, n) for p, n in jobs]
    steps, rows = server.metric("lmforge_decode_steps_total"), server.metric("lmforge_decode_rows_total")
    start = threading.Barrier(16)  # all 16 are sent at once, not as the pool's threads come up

    def together_with_the_others(job):
        start.wait(30)
        return complete(server.url, *job)

    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(together_with_the_others, jobs))
    assert together == solo
    # The engine sets the gauge on its next turn, after the last answer went out: on a loaded host, a moment later.
    deadline = time.monotonic() + 10
    while server.metric("lmforge_batch_size") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metric("lmforge_batch_size") == 0
    # they did share decode steps: more rows were decoded than steps were run
    assert server.metric("lmforge_decode_rows_total") - rows > server.metric("lmforge_decode_steps_total") - steps


@pytest.mark.parametrize("body, param", [
    ({"model": "gpt", "prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"model": "gpt", "prompt": "x", "max_tokens": 10 ** 9}, "max_tokens"),
    ({"model": "gpt", "prompt": "x", "n": 99}, "n"),
    ({"model": "nope", "prompt": "x"}, "model"),
    ({"model": "gpt", "messages": []}, "messages"),
    ({"model": "gpt", "prompt": "x", "frequency_penalty": 1}, "frequency_penalty"),
    ({"model": "gpt", "prompt": 7}, "prompt"),
])
def test_bad_input_gets_a_4xx_with_an_openai_error_body(server, body, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    status, _, out = post(server.url, path, body)
    assert 400 <= status < 500, out
    assert set(out["error"]) >= {"message", "type", "param"} and out["error"]["message"]
    assert param in (out["error"]["param"] or "")


def test_malformed_json_and_over_long_prompt_get_400(server):
    status, _, out = post(server.url, "/v1/completions", None, raw=b'{"model": "gpt", "prompt": ')
    assert status == 400 and "JSON" in out["error"]["message"]
    status, _, out = post(server.url, "/v1/completions", {"model": "gpt", "prompt": "the cat " * 200,
                                                          "max_tokens": 10})
    assert status == 400 and "maximum context length is 256" in out["error"]["message"]
    assert out["error"]["code"] == "context_length_exceeded"


def _stream(url: str, body: dict, key: str):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    return urllib.request.urlopen(req, timeout=120)


def _first_event(response) -> dict:
    while True:
        line = response.readline().decode().strip()
        if line.startswith("data: "):
            return json.loads(line[6:])


LONG = {"model": "slow", "prompt": "the cat", "max_tokens": 1000, "temperature": 0}


def test_api_key_is_required_when_set(small_server):
    for key in (None, "wrong-key"):
        status, _, out = post(small_server.url, "/v1/completions", {"model": "slow", "prompt": "x"}, key)
        assert status == 401 and out["error"]["type"] == "authentication_error"
    assert complete(small_server.url, "the cat", 2, model="slow", key=KEY) is not None


def test_a_full_queue_gets_429_with_retry_after(small_server):
    running = _stream(small_server.url, LONG, KEY)  # holds the only row
    _first_event(running)
    waiting = threading.Thread(target=post, args=(small_server.url, "/v1/completions",
                                                  {"model": "slow", "prompt": "x", "max_tokens": 2}, KEY))
    waiting.start()  # holds the only queue place
    deadline = time.monotonic() + 30
    while small_server.metric("lmforge_queue_length") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    status, headers, out = post(small_server.url, "/v1/completions", {"model": "slow", "prompt": "x"}, KEY)
    assert status == 429 and int(headers["Retry-After"]) >= 1 and out["error"]["type"] == "rate_limit_error"
    running.close()  # the client goes away: its row is freed, so the queued request runs
    waiting.join(60)
    assert not waiting.is_alive()


def test_a_client_disconnect_frees_its_row(small_server):
    cancelled = small_server.metric('lmforge_generations_total{model="slow",reason="cancelled"}')
    response = _stream(small_server.url, LONG, KEY)
    _first_event(response)
    assert small_server.metric("lmforge_batch_size") == 1
    response.close()
    deadline = time.monotonic() + 30
    while small_server.metric("lmforge_batch_size") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert small_server.metric("lmforge_batch_size") == 0
    assert small_server.metric('lmforge_generations_total{model="slow",reason="cancelled"}') == cancelled + 1


def test_sigterm_drains_running_requests_then_exits(small_server):
    response = _stream(small_server.url, {**LONG, "max_tokens": 400}, KEY)
    _first_event(response)
    small_server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    status, _, out = post(small_server.url, "/v1/completions", {"model": "slow", "prompt": "x"}, KEY)
    assert status == 503, out
    events = [line.decode().strip() for line in response]  # the running request goes on to its end
    data = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
    assert events[-2] == "data: [DONE]" or "data: [DONE]" in events
    assert data[-1]["choices"][0]["finish_reason"] == "length"
    assert small_server.proc.wait(30) == 0
