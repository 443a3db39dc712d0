"""``lmforge serve`` with retrieval: a completion asks for a served index's passages (``retrieval`` through the
official client's ``extra_body``), the model reads them in its prompt, and the answer lists them."""

from __future__ import annotations

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

import embedding_helpers as eh  # noqa: E402
import serve_helpers as sh  # noqa: E402
from lmforge.cli.main import main  # noqa: E402
from lmforge.prompting.rag import build_prompt, open_retriever  # noqa: E402

DOCS = eh.sentences(20, seed=5)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-rag")
    encoder = sh.encoder_folder(root / "enc")
    (root / "docs.txt").write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    assert main(["index", "build", "--model", str(encoder), "--docs", str(root / "docs.txt"), "--out",
                 str(root / "idx"), "--quiet"]) == 0
    s = sh.ThreadServer({"gpt": sh.gpt_folder(root / "gpt"), "verses": root / "idx"})
    s.index = root / "idx"
    yield s
    s.stop()


def test_completion_with_retrieval_reads_and_reports_the_passages(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    question = DOCS[4]
    answer = client.completions.create(model="gpt", prompt=question, max_tokens=3, temperature=0, echo=True,
                                       extra_body={"retrieval": {"index": "verses", "k": 2}})
    own = open_retriever(server.index).retrieve([question], 2)[0]
    retrieved = answer.model_extra["retrieved"]
    assert [[h["id"] for h in hits] for hits in retrieved] == [[p.id for p in own]]
    assert retrieved[0][0]["id"] == 4 and retrieved[0][0]["text"] == DOCS[4]
    # echo shows the prompt the model continued: the template with the passages in
    assert answer.choices[0].text.startswith(build_prompt(question, own))
    plain = client.completions.create(model="gpt", prompt=question, max_tokens=3, temperature=0)
    assert plain.model_extra.get("retrieved") is None


@pytest.mark.parametrize("retrieval, extra, status, words", [
    ({"index": "nope"}, {}, 404, "nope"),  # as an unknown model is
    ({"index": "gpt"}, {}, 400, "gpt"),  # a generator is not an index
    ({"index": "verses", "template": "{passages}"}, {}, 400, "{question}"),
    ({"index": "verses"}, {"stream": True}, 400, "stream"),
])
def test_bad_retrieval_is_refused_naming_it(server, retrieval, extra, status, words):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model="gpt", prompt="the cat", max_tokens=1,
                                  extra_body={"retrieval": retrieval, **extra})
    assert info.value.status_code == status and words in str(info.value)
