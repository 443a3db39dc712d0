"""Property: config and data-file parsing turn any input into a result or an LmforgeError, never another exception.

Hypothesis draws plain-data mappings (keyed mostly by the real field names, so that values reach validation),
YAML/JSON text and raw bytes. Runs are derandomised, so CI sees the same examples every time.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmforge.config import ModelConfig
from lmforge.data.sources import iter_documents
from lmforge.errors import LmforgeError
from lmforge.generation import GenerationConfig
from lmforge.peft.config import PeftConfig
from lmforge.tasks.data import read_table
from lmforge.tasks.spec import TaskSpec
from lmforge.training.config import TrainConfig
from lmforge.utils.io import read_mapping_file

CONFIGS = [ModelConfig, TrainConfig, PeftConfig, TaskSpec, GenerationConfig]
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(-3, 3), st.floats(), st.text(max_size=12),
                    st.sampled_from(["", "1e6", "auto", "-", "null", "rope", "decoder", "lora", "classify"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)


def _keys(cls) -> st.SearchStrategy[str]:
    names = [f.name for f in dataclasses.fields(cls)]
    return st.one_of(st.sampled_from(names), st.sampled_from(names).map(lambda n: n.replace("_", "-")),
                     st.text(max_size=10))


def _parses_or_refuses(parse, *args) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a setting the strategy ignores warns; that is a result too
        try:
            parse(*args)
        except LmforgeError:
            pass


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("props")


# ------------------------------------------------------------------------------------------ configs
@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_from_dict_gives_a_config_or_a_config_error(cls):
    @SETTINGS
    @given(st.one_of(st.dictionaries(_keys(cls), json_values, max_size=6), json_values))
    def check(data):
        _parses_or_refuses(cls.from_dict, data)

    check()


yaml_text = st.one_of(
    st.text(max_size=80),
    st.lists(st.tuples(st.sampled_from(["max_steps", "max-steps", "lr", "d_model", "method", "task", "top_p",
                                        "vocab_size", "a", "&x", "*x", "!!python/object", "- ", "? "]),
                       st.sampled_from([": ", ":", " - ", ": [", ": {", ": !!binary ", ": &a ", ": *a ", ": '", ""]),
                       st.text(max_size=10)), max_size=5)
    .map(lambda lines: "\n".join(k + sep + v for k, sep, v in lines)),
)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_load_of_any_yaml_or_json_text_gives_a_config_or_an_error(cls, folder):
    @SETTINGS
    @given(yaml_text, st.sampled_from([".yaml", ".json"]))
    def check(text, suffix):
        path = folder / f"{cls.__name__}{suffix}"
        path.write_text(text, encoding="utf-8")
        _parses_or_refuses(cls.load, path)

    check()


@SETTINGS
@given(st.binary(max_size=200), st.sampled_from([".yaml", ".yml", ".json"]))
def test_read_mapping_file_of_any_bytes_gives_data_or_an_error(folder, data, suffix):
    path = folder / f"mapping{suffix}"
    path.write_bytes(data)
    _parses_or_refuses(read_mapping_file, path)


# --------------------------------------------------------------------------------------- data files
def _texty_bytes() -> st.SearchStrategy[bytes]:
    """Raw bytes, and bytes built from the pieces these formats are made of (quotes, tabs, CR/LF, BOMs)."""
    pieces = st.sampled_from([b"text", b"label", b"\t", b",", b'"', b"\n", b"\r", b"\r\n", b"\xef\xbb\xbf", b"{",
                              b"}", b'"text"', b":", b" ", b"[", b"]", b"null", b"1", b"\xff", b"\xc3", b"\xa9",
                              b"-DOCSTART-", b"\x00"])
    return st.one_of(st.binary(max_size=120), st.lists(pieces, max_size=30).map(b"".join))


@SETTINGS
@given(_texty_bytes(), st.sampled_from([".txt", ".jsonl", ".csv", ".tsv", ".txt.gz"]),
       st.sampled_from(["strict", "replace"]))
def test_corpus_readers_give_documents_or_a_data_error(folder, data, suffix, errors):
    import gzip

    path = folder / f"corpus{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)

    def read():
        docs = list(iter_documents([path], errors=errors))
        assert all(isinstance(d, str) and d and "\r" not in d for d in docs)

    _parses_or_refuses(read)


@SETTINGS
@given(_texty_bytes(), st.sampled_from([".tsv", ".csv", ".jsonl", ".conll", ".tsv.gz"]), st.booleans())
def test_read_table_gives_rows_or_a_task_data_error(folder, data, suffix, damage_gzip):
    import gzip

    path = folder / f"table{suffix}"
    if suffix.endswith(".gz"):
        data = gzip.compress(data)[: -4 if damage_gzip else None]
    path.write_bytes(data)

    def read():
        table = read_table(path)
        assert table.rows and all(isinstance(c, str) for c in table.columns)

    _parses_or_refuses(read)


@SETTINGS
@given(st.one_of(yaml_text, st.binary(max_size=120).map(lambda b: b.decode("latin-1"))), st.booleans())
def test_settings_label_map_and_mixture_files_give_data_or_an_error(folder, text, latin1):
    from lmforge.tasks.settings import parse_label_map, read_mixture
    from lmforge.training.config import read_settings

    path = folder / "settings.yaml"
    path.write_bytes(text.encode("latin-1" if latin1 and all(ord(c) < 256 for c in text) else "utf-8"))
    for parse in (read_settings, parse_label_map, read_mixture):
        _parses_or_refuses(parse, str(path))
