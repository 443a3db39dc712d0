"""``lmforge``, ``lmforge --help`` and a mistyped verb answer from the verb table without importing any verb module;
every ``lmforge VERB --help`` works without the optional extras; the table's help lines are the modules' own."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from lmforge.cli._verbs import VERBS
from lmforge.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "sklearn", "scipy", "sympy", "pandas", "matplotlib")


def _python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT)


def _loaded_after(argv: list[str]) -> tuple[int, list[str]]:
    """Exit code of ``main(argv)`` in a fresh interpreter, and which of HEAVY it left in ``sys.modules``."""
    code = f"""
import contextlib, io, json, sys
from lmforge.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main({argv!r})
    except SystemExit as exc:
        code = exc.code
print(json.dumps([code, sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))]))
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    exit_code, heavy = json.loads(proc.stdout.strip().splitlines()[-1])
    return exit_code, heavy


def test_help_and_a_bare_lmforge_import_no_verb_module_and_no_heavy_library():
    for argv in ([], ["--help"], ["--version"], ["finetun"]):
        code, heavy = _loaded_after(argv)
        assert (code, heavy) == (2 if argv == ["finetun"] else 0, []), argv


def test_importtime_of_help_names_no_heavy_library():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "lmforge.cli.main", "--help"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and "finetune" in proc.stdout, proc.stderr[-2000:]
    imported = {m.split(".")[0] for m in re.findall(r"^import time:.*\|\s*(\S+)\s*$", proc.stderr, re.M)}
    assert "lmforge" in imported and not imported & set(HEAVY)
    assert not [m for m in re.findall(r"\|\s*(lmforge\.cli\.\S+)", proc.stderr)
                if m not in ("lmforge.cli.main", "lmforge.cli._verbs")]


def test_finetune_help_imports_no_sklearn_scipy_sympy_pandas():
    code, heavy = _loaded_after(["finetune", "--help"])
    assert code == 0 and not set(heavy) & {"sklearn", "scipy", "sympy", "pandas", "matplotlib"}, heavy


# ------------------------------------------------------------------------------------------- without the extras
_CORE_TOOLS = {"pytest", "pytest-xdist", "hypothesis", "schemathesis", "selenium"}  # test tools, never imported


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


def optional_modules() -> list[str]:
    """The top-level modules of every distribution named only in pyproject's optional dependencies (the ones
    installed here: a missing one is blocked already), as ``importlib.metadata`` maps them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    optional = {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    wanted = optional - core - _CORE_TOOLS
    modules = {top for top, dists in metadata.packages_distributions().items()
               if any(_name(d) in wanted for d in dists) and not top.startswith("_")}
    return sorted(modules)


def test_the_blocked_list_covers_the_extras_and_spares_torch():
    blocked = optional_modules()
    assert {"sklearn", "fastapi", "uvicorn", "transformers", "scipy"} <= set(blocked)
    assert not {"torch", "numpy", "tokenizers", "safetensors", "yaml", "lmforge"} & set(blocked)


_WITHOUT_EXTRAS = """
import argparse, contextlib, importlib.abc, io, json, sys, traceback

BLOCKED = set({blocked!r})

class NoExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{fullname!r}} (blocked)", name=fullname)
        return None

sys.meta_path.insert(0, NoExtras())
from lmforge.cli import main as cli

def paths(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from paths(sub, prefix + (name,))

def run(argv):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = cli.main(argv)
            except SystemExit as exc:
                code = exc.code
    except BaseException:
        return [argv, "raised", traceback.format_exc()[-1500:]]
    return [argv, code, out.getvalue()[-1500:]]

results = [run([]), run(["--help"]), run(["finetun"])]
for verb in {verbs!r}:
    try:
        commands = [c for c in paths(cli.build_parser(verb)) if c[0] == verb]
    except BaseException:
        results.append([[verb], "raised", traceback.format_exc()[-1500:]])
        continue
    results += [run([*c, "--help"]) for c in commands]
print(json.dumps(results))
"""


def test_every_verb_and_sub_verb_answers_help_without_the_optional_extras():
    """One interpreter, every optional extra's modules refused by a meta-path finder (as if not installed), loops
    over ``lmforge``, ``--help``, a mistyped verb and every ``VERB [SUB] --help`` of the table."""
    proc = _python(_WITHOUT_EXTRAS.format(blocked=optional_modules(), verbs=list(VERBS)), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    wrong = [(argv, code, text) for argv, code, text in results
             if code != (2 if argv == ["finetun"] else 0) or "Traceback" in text]
    assert wrong == []
    seen = {tuple(argv[:-1]) for argv, _, _ in results if argv[-1:] == ["--help"]}
    assert {("data", "prepare"), ("experiment", "run"), ("convert", "to-hf")} <= seen
    assert {(verb,) for verb in VERBS} <= seen
    mistyped = results[2][2]
    assert mistyped.count("\n") == 1 and "did you mean 'finetune'?" in mistyped


# ------------------------------------------------------------------------------------------- the table
def test_the_table_is_every_registered_verb_with_its_own_help_line():
    parser = build_parser()  # every module of lmforge.cli that registers a verb
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    registered = {choice.dest: choice.help for choice in action._choices_actions}
    assert registered == {name: verb.help for name, verb in VERBS.items()}
    assert list(registered) == list(VERBS)  # the order --help lists them in


def test_each_verb_is_registered_by_its_tables_module():
    for name, verb in VERBS.items():
        parser = build_parser(name)
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        assert list(action.choices) == [name], (name, verb.module)


def test_help_lists_every_verb_of_the_table(capsys):
    from lmforge.cli.main import main

    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    assert all(re.search(rf"^\s+{re.escape(name)}\s", out, re.M) for name in VERBS)
    assert "exit codes:" in out


def test_a_mistyped_verb_is_one_line_with_the_closest_verb(capsys):
    from lmforge.cli.main import main

    try:
        main(["fintune", "--model", "x"])
    except SystemExit as exc:
        assert exc.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'fintune'; did you mean 'finetune'?" in err


def test_the_linear_baselines_static_names_are_the_pipelines_sklearn_builds():
    from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    from lmforge.evaluation import baselines, linear_baselines

    kinds = {name: tuple(type(step) for _, step in linear_baselines.pipeline(name).steps)
             for name in linear_baselines.LINEAR}
    assert kinds == {"tfidf-logreg": (TfidfVectorizer, LogisticRegression), "ngram-svm": (CountVectorizer, LinearSVC)}
    assert set(linear_baselines.LINEAR) <= set(baselines.BASELINES)


def test_the_task_baselines_static_names_are_the_models_their_libraries_build():
    import sklearn_crfsuite
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import Ridge

    from lmforge.evaluation import baselines, crf_tagger, mc_similarity, ridge_baseline, task_baselines

    assert baselines.TASK_BASELINES == tuple(task_baselines.FITS)
    assert set(baselines.fits()) == set(baselines.BASELINES)
    assert [type(step) for _, step in ridge_baseline.pipeline().steps] == [TfidfVectorizer, Ridge]
    assert isinstance(crf_tagger.crf(), sklearn_crfsuite.CRF)
    assert isinstance(mc_similarity.vectorizer(), TfidfVectorizer)
