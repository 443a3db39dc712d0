"""Schema-based fuzzing of the serve app: schemathesis generates requests from the app's own OpenAPI schema
(valid and invalid ones) for every operation; none may get a 5xx, and every response must conform to the
schema (documented status codes, OpenAI-style error bodies). A bounded number of examples per operation."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

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


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_fuzzed_requests_get_no_5xx_and_conform_to_the_schema(api_schema, mode):
    operations = _operations(api_schema)
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                                              "/v1/models", "/health"}
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
            case.validate_response(response)

        check()
    assert seen and max(seen) < 500
