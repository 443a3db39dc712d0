"""Schema-based fuzzing of the serve app: schemathesis generates requests from the app's own OpenAPI schema
(valid and invalid ones) for every operation; none may get a 5xx, and every response must conform to the
schema (documented status codes, OpenAI-style error bodies). A bounded number of examples per operation.
The completions fields that evaluation clients use (every prompt form, ``echo``, ``logprobs`` up to 20,
``max_tokens`` 0) get a run of their own, since a schema-wide run seldom sets them together."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import serve_helpers as sh  # noqa: E402
from lmforge.serve.app import create_app  # noqa: E402
from lmforge.serve.limits import Limits  # noqa: E402
from lmforge.serve.metrics import Metrics  # noqa: E402
from lmforge.serve.served import load_served  # noqa: E402


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    limits = Limits(max_batch=4, max_queue=64, max_len=64, timeout=30)
    metrics = Metrics()
    served = {"gpt": load_served("gpt", sh.gpt_folder(root / "gpt", max_seq_len=64), limits,
                                 observe=metrics.observer("gpt")),
              "enc": load_served("enc", sh.encoder_folder(root / "enc"), limits)}
    yield create_app(served, limits, metrics=metrics)
    for m in served.values():
        m.close()


@pytest.fixture(scope="module")
def api_schema(app):
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _operations(api_schema):
    return [result.ok() for result in api_schema.get_all_operations()]


def _validate(case, response) -> None:
    """Schema conformance of ``response``. A 400 for a limit of the served model that no schema states (its
    context length, its vocabulary, what its chat template needs) is not a schema-valid body rejected."""
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    error = response.json().get("error", {}) if response.status_code == 400 else {}
    beyond = (error.get("code") == "context_length_exceeded" or "outside the vocabulary" in error.get("message", "")
              or error.get("param") == "messages")
    case.validate_response(response, excluded_checks=[positive_data_acceptance] if beyond else None)


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_fuzzed_requests_get_no_5xx_and_conform_to_the_schema(api_schema, mode):
    operations = _operations(api_schema)
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                                              "/v1/models", "/health", "/tokenize", "/detokenize",
                                              "/tokenizer_info"}
    seen = []
    for op in operations:
        if mode == "negative" and op.method.upper() == "GET":
            continue  # no parameters to break

        @given(case=op.as_strategy(schemathesis.GenerationMode(mode)))
        @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def check(case):
            response = case.call()
            seen.append(response.status_code)
            assert response.status_code < 500, f"{case.method} {case.path} {case.body!r}: {response.text}"
            _validate(case, response)

        check()
    assert seen and max(seen) < 500


def test_fuzzed_scoring_requests_get_no_5xx(api_schema):
    """Schema-valid completions bodies with the scoring fields forced in: echo, logprobs 0..20, max_tokens 0..3,
    and prompts of token ids (in and out of the vocabulary, over the context) as well as the schema's own."""
    (op,) = [o for o in _operations(api_schema) if o.path == "/v1/completions"]
    ids = st.lists(st.integers(0, 400), min_size=1, max_size=70)
    prompts = st.one_of(st.none(), ids, st.lists(ids, min_size=1, max_size=3))
    seen = []

    @given(case=op.as_strategy(schemathesis.GenerationMode.POSITIVE), prompt=prompts, echo=st.booleans(),
           logprobs=st.one_of(st.none(), st.integers(0, 20)), max_tokens=st.integers(0, 3))
    @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    def check(case, prompt, echo, logprobs, max_tokens):
        body = dict(case.body) if isinstance(case.body, dict) else {"model": "gpt"}
        body.update(model="gpt", echo=echo, logprobs=logprobs, max_tokens=max_tokens, stream=False)
        body.pop("retrieval", None)  # searching needs a text prompt: tests/test_serve_rag.py covers that refusal
        if prompt is not None:
            body["prompt"] = prompt
        case.body = body
        response = case.call()
        seen.append(response.status_code)
        assert response.status_code < 500, f"{case.body!r}: {response.text}"
        _validate(case, response)
        if response.status_code == 200 and echo and logprobs is not None:
            choice = response.json()["choices"][0]
            assert choice["logprobs"]["token_logprobs"][0] is None

    check()
    assert 200 in seen and any(400 <= code < 500 for code in seen)  # both sides of the limits were explored
