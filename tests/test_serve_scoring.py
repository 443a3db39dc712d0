"""Scoring prompts through ``lmforge serve``, as evaluation clients (lm-evaluation-harness's ``local-completions``)
do: every prompt form of OpenAI's completions API, ``echo`` with ``logprobs`` and ``max_tokens: 0``, the
tokenizer endpoints (vLLM's shapes), the limits that refuse a request with 400/413 naming them, and the chat
template that ``convert to-hf`` exports for ``tokenizer.apply_chat_template``.

The reference is a plain forward pass of the same folder, loaded on its own: at every prompt position the
served log-probabilities equal its ``log_softmax`` (<= 1e-5, fp32), alone, in a batch of prompts, and among
concurrent requests that share the scheduler with generations."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import serve_helpers as sh  # noqa: E402

import lmforge  # noqa: E402
from lmforge.generation import encode_prompt  # noqa: E402
from lmforge.prompting.instruct import ChatTemplate  # noqa: E402
from lmforge.serve.batching.job import Echo, Job, Token  # noqa: E402
from lmforge.serve.batching.scheduler import Scheduler  # noqa: E402
from lmforge.tokenization import Tokenizer  # noqa: E402

MAX_LEN = 64
TOL = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return sh.gpt_folder(tmp_path_factory.mktemp("scoring") / "gpt", max_seq_len=MAX_LEN)


@pytest.fixture(scope="module")
def ref(folder):
    """The folder loaded on its own, and its tokenizer: the reference forward pass."""
    return lmforge.load(folder).eval(), Tokenizer.load(folder)


@pytest.fixture(scope="module")
def server(folder):
    s = sh.ThreadServer({"gpt": folder}, max_batch=4, max_queue=16, max_request_tokens=2000)
    yield s
    s.stop()


def post(url: str, path: str, body) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def get(url: str, path: str) -> tuple[int, dict]:
    with urllib.request.urlopen(url + path, timeout=30) as r:
        return r.status, json.loads(r.read())


def score(url: str, prompt, logprobs: int = 5, max_tokens: int = 0, **extra) -> dict:
    status, out = post(url, "/v1/completions", {"model": "gpt", "prompt": prompt, "echo": True,
                                                "max_tokens": max_tokens, "logprobs": logprobs,
                                                "temperature": 0, **extra})
    assert status == 200, out
    return out


def reference_logprobs(ref, ids: list[int]) -> torch.Tensor:
    """log_softmax of one full forward pass over ``ids``: (T, V), row t predicting token t+1."""
    model, _ = ref
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def text_of(tok, i: int) -> str:
    return tok.decode([i], skip_special_tokens=False)


def assert_scores(ref, choice: dict, ids: list[int], k: int) -> None:
    """``choice``'s echo equals the reference at every prompt position: the token, its logprob, the top k."""
    _, tok = ref
    logp = reference_logprobs(ref, ids)
    lp = choice["logprobs"]
    T = len(ids)
    assert lp["tokens"][:T] == [text_of(tok, i) for i in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts the first token
    got = torch.tensor(lp["token_logprobs"][1:T], dtype=torch.float32)
    want = logp[torch.arange(T - 1), torch.tensor(ids[1:], dtype=torch.long)]
    assert torch.allclose(got, want, atol=TOL, rtol=0), (got - want).abs().max()
    for t in range(1, T):
        values, top_ids = logp[t - 1].topk(k)
        expected: dict[str, float] = {}
        # the top k and the token itself (as OpenAI's API); ids of one text (byte pieces) keep the highest
        for i in top_ids.tolist() + [ids[t]]:
            s = text_of(tok, i)
            expected[s] = max(expected.get(s, -float("inf")), logp[t - 1, i].item())
        top = lp["top_logprobs"][t]
        assert top.keys() == expected.keys()
        assert all(abs(top[s] - expected[s]) <= TOL for s in top)
    offsets = [sum(len(s) for s in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    assert lp["text_offset"] == offsets


def test_a_text_prompt_is_scored_at_every_position(server, ref):
    model, tok = ref
    text = "the cat sat on the mat"
    out = score(server.url, text)
    ids = encode_prompt(model, tok, text)
    (choice,) = out["choices"]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    usage = {k: v for k, v in out["usage"].items() if k != "price"}  # the price tag: tests/test_inference_price.py
    assert usage == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
    assert out["usage"]["price"]["flops"] > 0
    assert_scores(ref, choice, ids, 5)


@pytest.mark.parametrize("k", [0, 1, 20])
def test_token_id_prompts_single_and_batched_are_scored_at_every_position(server, ref, k):
    g = torch.Generator().manual_seed(k)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (1, 7, 30, MAX_LEN)]
    single = score(server.url, prompts[2], logprobs=k)  # a list of ids: one prompt
    assert_scores(ref, single["choices"][0], prompts[2], k)
    batched = score(server.url, prompts, logprobs=k)  # a list of lists: one choice per prompt, in order
    assert [c["index"] for c in batched["choices"]] == [0, 1, 2, 3]
    for choice, ids in zip(batched["choices"], prompts):
        assert_scores(ref, choice, ids, k)
    assert batched["choices"][0]["logprobs"]["token_logprobs"] == [None]  # a one-token prompt: nothing to score


def test_several_texts_in_one_request(server, ref):
    model, tok = ref
    texts = ["a dog ran", "the river by the big house", "paris"]
    out = score(server.url, texts, logprobs=3)
    for choice, text in zip(out["choices"], texts):
        assert choice["text"] == text
        assert_scores(ref, choice, encode_prompt(model, tok, text), 3)


def test_concurrent_scoring_and_generation_requests(server, ref):
    """Scoring requests among generations, all sent at once, through one scheduler: each equals its reference,
    and each generation its greedy text alone."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 300, (int(n),), generator=g).tolist() for n in torch.randint(2, 60, (12,), generator=g)]
    gen = {"model": "gpt", "prompt": "the cat", "max_tokens": 20, "temperature": 0}
    solo = post(server.url, "/v1/completions", gen)[1]["choices"][0]["text"]
    start = threading.Barrier(len(prompts) + 3)

    def one(item):
        start.wait(30)
        if item is None:
            return post(server.url, "/v1/completions", gen)[1]
        return score(server.url, [item], logprobs=2)

    with ThreadPoolExecutor(len(prompts) + 3) as pool:
        results = list(pool.map(one, prompts + [None] * 3))
    for ids, out in zip(prompts, results):
        assert_scores(ref, out["choices"][0], ids, 2)
    assert all(out["choices"][0]["text"] == solo for out in results[len(prompts):])


def test_echo_with_generation_scores_the_prompt_and_then_generates(server, ref):
    """max_tokens 1 with echo is lm-evaluation-harness's loglikelihood request; more tokens take a cache row.
    Either way the prompt is scored exactly and the generated text equals the request without echo."""
    model, tok = ref
    ids = encode_prompt(model, tok, "the dog ran to a big house")
    for n in (1, 6):
        plain = post(server.url, "/v1/completions", {"model": "gpt", "prompt": [ids], "max_tokens": n,
                                                     "temperature": 0, "logprobs": 1})[1]["choices"][0]
        out = score(server.url, [ids], logprobs=1, max_tokens=n)["choices"][0]
        assert_scores(ref, out, ids, 1)
        assert out["text"] == tok.decode(ids) + plain["text"]
        lp = out["logprobs"]
        assert lp["tokens"][len(ids):] == plain["logprobs"]["tokens"]
        assert lp["token_logprobs"][len(ids):] == pytest.approx(plain["logprobs"]["token_logprobs"], abs=TOL)
        first = reference_logprobs(ref, ids)[-1]  # the first generated token: greedy from the last position
        assert lp["token_logprobs"][len(ids)] == pytest.approx(first.max().item(), abs=TOL)
        assert lp["text_offset"][len(ids)] == sum(len(s) for s in lp["tokens"][:len(ids)])


def test_lm_eval_local_completions_parses_the_answer_into_the_reference_loglikelihood(server, ref):
    """The request lm-evaluation-harness 0.4's ``local-completions`` sends for loglikelihood, parsed by its own
    ``parse_logprobs``: the continuation's summed logprob and is-greedy equal the reference's."""
    oc = pytest.importorskip("lm_eval.models.openai_completions")
    api = oc.LocalCompletionsAPI.__new__(oc.LocalCompletionsAPI)
    api.model = "gpt"
    g = torch.Generator().manual_seed(3)
    requests = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (9, 25)]
    ctxlens = [5, 20]
    payload = api._create_payload(requests, generate=False, seed=1234)
    status, out = post(server.url, "/v1/completions", payload)
    assert status == 200, out
    parsed = oc.LocalCompletionsAPI.parse_logprobs(outputs=out, tokens=requests, ctxlens=ctxlens)
    for (ll, greedy), ids, ctx in zip(parsed, requests, ctxlens):
        logp = reference_logprobs(ref, ids)
        want = logp[torch.arange(ctx - 1, len(ids) - 1), torch.tensor(ids[ctx:], dtype=torch.long)]
        assert ll == pytest.approx(want.sum().item(), abs=1e-4)
        assert greedy == bool((logp[ctx - 1:len(ids) - 1].argmax(-1) == torch.tensor(ids[ctx:])).all())
    # (a 1-layer random model with tied embeddings predicts its input token: random continuations are not greedy)
    # a continuation made of the greedy tokens is greedy
    ids = requests[0][:5]
    for _ in range(4):
        ids = ids + [int(reference_logprobs(ref, ids)[-1].argmax())]
    out = post(server.url, "/v1/completions", api._create_payload([ids], generate=False, seed=1234))[1]
    assert oc.LocalCompletionsAPI.parse_logprobs(outputs=out, ctxlens=[5])[0][1] is True


def test_the_openai_client_sends_token_id_prompts_and_echo(server, ref):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    ids = [[5, 17, 200, 33, 9], [40, 41]]
    out = client.completions.create(model="gpt", prompt=ids, echo=True, max_tokens=0, logprobs=5)
    for choice, prompt in zip(sorted(out.choices, key=lambda c: c.index), ids):
        assert_scores(ref, choice.model_dump(), prompt, 5)
    gen = client.completions.create(model="gpt", prompt=[5, 17, 200], max_tokens=4, temperature=0)
    assert gen.usage.prompt_tokens == 3 and gen.usage.completion_tokens <= 4


def test_streamed_echo_sends_the_prompt_first(server, ref):
    ids = [5, 17, 200, 33]
    req = urllib.request.Request(server.url + "/v1/completions", data=json.dumps(
        {"model": "gpt", "prompt": [ids], "echo": True, "max_tokens": 3, "logprobs": 2, "temperature": 0,
         "stream": True}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.read().decode().splitlines()
                  if line.startswith("data: {")]
    first = events[0]["choices"][0]
    assert first["logprobs"]["token_logprobs"][0] is None and len(first["logprobs"]["tokens"]) == len(ids)
    assert_scores(ref, first, ids, 2)
    whole = score(server.url, [ids], logprobs=2, max_tokens=3)["choices"][0]
    assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
    scored = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"]]  # the last: the reason
    for key in ("tokens", "token_logprobs", "text_offset"):
        assert [x for lp in scored for x in lp[key]] == whole["logprobs"][key]


# --------------------------------------------------------------------------- tokenizer endpoints


def test_tokenize_detokenize_and_tokenizer_info_in_vllms_shapes(server, ref):
    model, tok = ref
    text = "the cat sat on the mat<|endoftext|>"
    status, out = post(server.url, "/tokenize", {"model": "gpt", "prompt": text, "return_token_strs": True})
    assert status == 200 and set(out) == {"count", "max_model_len", "tokens", "token_strs"}
    assert out["tokens"] == encode_prompt(model, tok, text) and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == MAX_LEN and out["token_strs"] == [tok.id_to_token(i) for i in out["tokens"]]
    assert score(server.url, text)["choices"][0]["logprobs"]["tokens"] == [text_of(tok, i) for i in out["tokens"]]
    # what lm-evaluation-harness's remote tokenizer sends: no model, no special tokens added
    status, bare = post(server.url, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert bare["tokens"] == tok.encode(text, add_special_tokens=False) and bare["token_strs"] is None
    assert bare["tokens"][-1] == tok.token_to_id("<|endoftext|>")  # a special token's text is its id
    status, back = post(server.url, "/detokenize", {"tokens": bare["tokens"]})
    assert status == 200 and back == {"prompt": text}  # lossless: special tokens kept
    status, info = get(server.url, "/tokenizer_info")
    assert info["eos_token"] == "<|endoftext|>" and info["model_max_length"] == MAX_LEN
    assert info["vocab_size"] == tok.vocab_size and info["model"] == "gpt"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    status, chat = post(server.url, "/tokenize", {"messages": messages})
    template = ChatTemplate.load(server.served["gpt"].folder)
    assert chat["tokens"] == template.encode(tok, messages, add_generation_prompt=True)[0]
    jinja2 = pytest.importorskip("jinja2")
    rendered = jinja2.Environment().from_string(info["chat_template"]).render(messages=messages,
                                                                              add_generation_prompt=True)
    assert rendered == "".join(p for p, _ in template.render(messages, "<|endoftext|>", add_generation_prompt=True))


def test_lm_eval_remote_tokenizer_reads_the_server(server, ref):
    """lm-evaluation-harness's ``tokenizer_backend=remote`` (chosen automatically when a server answers
    /tokenizer_info and /tokenize) encodes, decodes and renders chats as lmforge does."""
    utils = pytest.importorskip("lm_eval.utils")
    _, tok = ref
    assert utils.check_remote_tokenizer_support(server.url + "/v1/completions")
    remote = utils.RemoteTokenizer(server.url + "/v1/completions")
    text = "a small red house by the river"
    assert remote.encode(text) == tok.encode(text, add_special_tokens=False)
    assert remote.decode(remote.encode(text)) == text
    assert remote.eos_token_id == tok.token_to_id("<|endoftext|>")
    messages = [{"role": "user", "content": "where is the cat"}, {"role": "assistant", "content": "on the mat"},
                {"role": "user", "content": "and the dog"}]
    template = ChatTemplate()  # what sh.gpt_folder saved
    want = "".join(p for p, _ in template.render(messages, "<|endoftext|>", add_generation_prompt=True))
    assert remote.apply_chat_template(messages) == want


# --------------------------------------------------------------------------- bad input and limits

LONG = list(range(1, MAX_LEN + 2))  # one token over the context


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": LONG, "echo": True, "max_tokens": 0, "logprobs": 1}, "prompt", "maximum context length is 64"),
    ({"prompt": [LONG[:10], LONG], "echo": True, "max_tokens": 0}, "prompt[1]", "maximum context length"),
    ({"prompt": [5, 6], "echo": True, "max_tokens": 0, "logprobs": 21}, "logprobs", "20"),
    ({"prompt": [[5, 6], [7, 300]], "echo": True, "max_tokens": 0}, "prompt[1][1]", "outside the vocabulary"),
    ({"prompt": [5, -1]}, "prompt[1]", "outside the vocabulary"),
    ({"prompt": []}, "prompt", "empty list"),
    ({"prompt": [[]]}, "prompt[0]", "empty list of token ids"),
    ({"prompt": [[5], []]}, "prompt[1]", "empty list of token ids"),
    ({"prompt": ["the cat", 5]}, "prompt", "mixes texts"),
    ({"prompt": [[5, 6], 7]}, "prompt", "mixes lists of token ids"),
    ({"prompt": [5, "x"]}, "prompt", "mixes texts"),
    ({"prompt": [True, 5]}, "prompt[0]", "not a token id"),
    ({"prompt": [[1.5, 2]]}, "prompt[0][0]", "not a token id"),
    ({"prompt": None}, "prompt", "not a prompt"),
    ({"prompt": {"text": "x"}}, "prompt", "not a prompt"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens", ""),
])
def test_bad_prompts_get_400_naming_the_field_and_the_server_keeps_serving(server, body, param, words):
    status, out = post(server.url, "/v1/completions", {"model": "gpt", **body})
    assert status == 400, out
    err = out["error"]
    assert err["param"] == param and err["message"].startswith(param) and words in err["message"]
    assert "prompt.str" not in err["message"] and "valid string" not in err["message"]
    assert score(server.url, [5, 6, 7])["choices"][0]["logprobs"]["token_logprobs"][0] is None


def test_tokenizer_endpoints_refuse_bad_input_with_400(server):
    for path, body, param in [("/detokenize", {"tokens": [5, 300]}, "tokens[1]"),
                              ("/detokenize", {"tokens": [-2]}, "tokens[0]"),
                              ("/tokenize", {}, "prompt"),
                              ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]},
                               "messages"),
                              ("/tokenize", {"model": "nope", "prompt": "x"}, "model")]:
        status, out = post(server.url, path, body)
        assert 400 <= status < 500 and out["error"]["param"] == param, (path, body, out)


def test_the_request_token_budget_gets_413_naming_it(server):
    prompts = [list(range(1, 60))] * 20  # 20 prompts x (59 + 1) tokens = 1200
    status, out = post(server.url, "/v1/completions", {"model": "gpt", "prompt": prompts, "max_tokens": 1, "n": 2})
    assert status == 413 and "--max-request-tokens" in out["error"]["message"] and "2400" in out["error"]["message"]
    assert post(server.url, "/v1/completions", {"model": "gpt", "prompt": prompts[:4], "max_tokens": 1})[0] == 200


def test_a_request_that_can_never_fit_gets_400_not_429(folder):
    """--max-batch 1 --max-queue 1: n=2 runs (one row, then the other), which got 429 on an idle server before;
    more generations than rows plus queue places could never run, so they get 400 naming the limits."""
    s = sh.ThreadServer({"gpt": folder}, max_batch=1, max_queue=1)
    try:
        for _ in range(3):
            status, out = post(s.url, "/v1/completions", {"model": "gpt", "prompt": "the cat", "n": 2,
                                                          "max_tokens": 3, "temperature": 0})
            assert status == 200 and len(out["choices"]) == 2, out
        status, out = post(s.url, "/v1/completions", {"model": "gpt", "prompt": "the cat", "n": 3, "max_tokens": 3})
        assert status == 400 and out["error"]["param"] == "n", out
        assert "max_batch + max_queue = 1 + 1 = 2" in out["error"]["message"]
        status, out = post(s.url, "/v1/completions", {"model": "gpt", "prompt": ["a", "b", "c"], "max_tokens": 3})
        assert status == 400 and out["error"]["param"] == "prompt", out
        assert post(s.url, "/v1/completions", {"model": "gpt", "prompt": "x", "max_tokens": 2})[0] == 200
    finally:
        s.stop()


# --------------------------------------------------------------------------- the scheduler


def test_scoring_jobs_neither_wait_for_a_row_nor_stall_a_running_generation(ref):
    """One row, busy with a long generation: scoring jobs still run (they need no row), one forward each turn,
    and the generation gets a decode step between every two of them."""
    model, _ = ref
    events, lock = [], threading.Lock()

    def recorder(name):
        def emit(event):
            with lock:
                events.append((name, "token" if isinstance(event, Token) else "echo" if isinstance(event, Echo)
                               else event[0]))
        return emit

    engine = Scheduler(model, max_batch=1, max_queue=32, max_len=MAX_LEN)
    engine.score_tokens = 20  # one prompt per scoring forward
    long = Job([5, 6, 7], max_new_tokens=50, decode=lambda ids: "", emit=recorder("gen"))  # no EOS: 50 steps
    scoring = [Job(list(range(1, 20)), max_new_tokens=0, decode=lambda ids: "", emit=recorder(f"s{i}"), echo=True,
                   logprobs=1) for i in range(10)]
    engine.submit(long)
    engine.submit_many(scoring)
    engine.start()
    try:
        assert engine.wait_idle(timeout=60)
    finally:
        engine.stop()
    done = [i for i, (name, kind) in enumerate(events) if kind == "done"]
    order = [events[i][0] for i in done]
    assert order[-1] == "gen"  # every scoring job ended while the one row was still generating
    s_done = [i for i, (name, kind) in enumerate(events) if name.startswith("s") and kind == "done"]
    between = [sum(1 for name, kind in events[a:b] if name == "gen" and kind == "token")
               for a, b in zip(s_done, s_done[1:])]
    assert between and all(n >= 1 for n in between), between  # the generation stepped between each two
    assert all(kind == "echo" for name, kind in events if name.startswith("s") and kind not in ("done",))


# --------------------------------------------------------------------------- convert to-hf: the chat template


def _conversations():
    return [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "where is the cat?"},
         {"role": "assistant", "content": "on the mat"}, {"role": "user", "content": "and the dog?\n"}],
        [{"role": "user", "content": "say 'x' \"y\" \\n"}, {"role": "assistant", "content": "x y"}],
    ]


@pytest.mark.parametrize("family", ["gpt", "roberta"])
def test_to_hf_exports_the_chat_template_for_apply_chat_template(tmp_path, family):
    """HF's ``AutoTokenizer.from_pretrained(export).apply_chat_template`` renders what lmforge renders (the
    BOS that lmforge's encoding opens with, when the tokenizer has one distinct from EOS, included)."""
    transformers = pytest.importorskip("transformers")
    from lmforge.cli.main import main
    from lmforge.tokenization import train_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat. a dog ran to the big house.\n" * 20, encoding="utf-8")
    tok = train_tokenizer([corpus], kind="byte-bpe", vocab_size=300, family=family, min_frequency=1,
                          show_progress=False)
    ids = {k: v for k, v in tok.special_token_ids().items() if k.endswith("_token_id")}
    model = lmforge.build_model("gpt-tiny" if family == "gpt" else "llama-tiny", n_layers=1, d_model=32, n_heads=2,
                                d_ff=64, vocab_size=tok.vocab_size, max_seq_len=64, **ids)
    folder = lmforge.save(model, tmp_path / "model", tokenizer=tok)
    template = ChatTemplate(system="### System: {content}\n\n", user="### User: {content}{eos}\n",
                            assistant="### Assistant:\n{content}{eos}\n")
    template.save(folder)
    assert main(["convert", "to-hf", str(folder), str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert "chat_template" in config
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    eos, bos = tok.special_token("eos"), tok.special_token("bos")
    prefix = bos if bos != eos else ""
    for messages in _conversations():
        for gen in (True, False):
            if not gen and messages[-1]["role"] != "assistant":
                continue
            want = prefix + "".join(p for p, _ in template.render(messages, eos, add_generation_prompt=gen))
            assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen) == want
            assert tok.decode(template.encode(tok, messages, gen)[0], skip_special_tokens=False) == want


def test_to_hf_without_a_chat_template_writes_none(tmp_path):
    from lmforge.cli.main import main

    folder = sh.gpt_folder(tmp_path / "gpt")
    (folder / "chat_template.json").unlink()
    assert main(["convert", "to-hf", str(folder), str(tmp_path / "hf")]) == 0
    assert "chat_template" not in json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())


@pytest.mark.parametrize("moe", [False, True])
def test_scheduler_scores_prompts_of_different_lengths_as_each_alone(moe):
    """Right-padded scoring batches equal each prompt's own forward; a model whose MoE layers drop tokens
    over a capacity (padding would take some) is batched only by equal lengths, and equals them too."""
    torch.manual_seed(0)
    extra = dict(moe_experts=4, moe_top_k=1, moe_capacity_factor=1.0) if moe else {}
    model = lmforge.build_model("gpt-tiny", n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=300,
                                max_seq_len=64, dropout=0.0, **extra).eval()
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (3, 17, 40, 17, 9)]
    got = [[] for _ in prompts]
    jobs = [Job(p, 0, decode=lambda ids: "", emit=got[i].append, echo=True, logprobs=3)
            for i, p in enumerate(prompts)]
    engine = Scheduler(model, max_batch=2, max_queue=16, max_len=64)
    assert engine.pad_ok is not moe
    forwards, forward = [], model.forward
    model.forward = lambda ids, *a, **k: forwards.append(tuple(ids.shape)) or forward(ids, *a, **k)
    engine.submit_many(jobs)
    engine.start()
    try:
        assert engine.wait_idle(60)
    finally:
        engine.stop()
        model.forward = forward
    assert forwards == ([(1, 3), (2, 17), (1, 40), (1, 9)] if moe else [(5, 40)])  # MoE: equal lengths only
    for p, events in zip(prompts, got):
        echo, done = events
        assert done == ("done", "length")
        with torch.no_grad():
            logp = model(torch.tensor([p])).logits[0].log_softmax(-1)
        want = logp[torch.arange(len(p) - 1), torch.tensor(p[1:])].tolist()
        assert echo.logprobs[0] is None and echo.logprobs[1:] == pytest.approx(want, abs=TOL)
