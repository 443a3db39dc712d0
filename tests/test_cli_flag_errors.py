"""A flag mistake on any verb is one stderr line, ``lmforge VERB: error: ...``, with the closest flag, exit 2.

Every verb and sub-verb is taken from the parser itself, so a verb added later is covered without editing this
file. The typo is made from one of that verb's own flags (two letters swapped); a prefix of a real flag must be
refused too (no argparse abbreviation matching), and nothing runs: each command fails in parsing.
"""

from __future__ import annotations

import argparse

import pytest

from lmforge.cli.main import build_parser, main


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(words, parser) of every command that runs: a verb without sub-verbs, or each sub-verb."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for action in subs:
        seen = set()
        for name, sub in action.choices.items():
            if id(sub) in seen:  # an alias of a sub-verb already listed
                continue
            seen.add(id(sub))
            yield from _leaves(sub, (*path, name))


LEAVES = {" ".join(path): parser for path, parser in _leaves(build_parser())}


def _long_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [o for o in parser._option_string_actions if o.startswith("--") and o not in ("--help", "--threads")]


def _typo(flag: str) -> str:
    """``flag`` with its first pair of distinct adjacent letters after ``--x`` swapped."""
    body = list(flag)
    for i in range(3, len(body) - 1):
        if body[i] != body[i + 1] and body[i].isalpha() and body[i + 1].isalpha():
            body[i], body[i + 1] = body[i + 1], body[i]
            return "".join(body)
    raise AssertionError(f"no swappable letters in {flag}")


def _pick(parser: argparse.ArgumentParser) -> str:
    """The verb's longest own flag whose typo is no real flag (a long flag has one closest match)."""
    own = _long_flags(parser) or ["--threads"]
    for flag in sorted(own, key=lambda f: (-len(f), f)):
        if len(flag) >= 6 and _typo(flag) not in parser._option_string_actions:
            return flag
    raise AssertionError(f"no flag to mistype among {own}")


def _run(capsys, argv: list[str]) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    return stop.value.code, err.splitlines()


def test_the_parser_lists_sub_verbs():
    # The enumeration must reach sub-verbs, else "every verb" would silently mean "every top-level verb".
    for verb in ("finetune", "pretrain", "generate", "peft merge", "convert to-hf"):
        assert verb in LEAVES, sorted(LEAVES)
    assert len(LEAVES) > 40


@pytest.mark.parametrize("verb", sorted(LEAVES))
def test_a_typo_gives_one_line_with_the_flag(capsys, verb):
    flag = _pick(LEAVES[verb])
    typo = _typo(flag)
    code, lines = _run(capsys, [*verb.split(), typo, "5"])
    assert code == 2
    assert lines == [f"lmforge {verb}: error: unknown flag {typo}; did you mean {flag}?"]


@pytest.mark.parametrize("verb", sorted(LEAVES))
def test_a_prefix_is_refused(capsys, verb):
    parser = LEAVES[verb]
    own = _long_flags(parser) or ["--threads"]
    # A prefix that only one flag starts with: argparse's abbreviation matching would take it for that flag.
    candidates = [(f[:-1], f) for f in own if len(f) > 4
                  and f[:-1] not in parser._option_string_actions
                  and sum(o.startswith(f[:-1]) for o in parser._option_string_actions) == 1]
    assert candidates, own
    prefix, flag = candidates[0]
    code, lines = _run(capsys, [*verb.split(), prefix, "5"])
    assert code == 2
    assert lines == [f"lmforge {verb}: error: unknown flag {prefix}; did you mean {flag}?"]


def test_the_max_steps_story(capsys):
    # The two mistakes of the issue, verbatim.
    assert _run(capsys, ["finetune", "--max-stpes", "5"]) == (
        2, ["lmforge finetune: error: unknown flag --max-stpes; did you mean --max-steps?"])
    assert _run(capsys, ["finetune", "--max-step", "5"]) == (
        2, ["lmforge finetune: error: unknown flag --max-step; did you mean --max-steps?"])


def test_a_typo_of_a_required_flag_is_named_not_reported_missing(capsys):
    code, lines = _run(capsys, ["generate", "--modle", "x"])
    assert (code, lines) == (2, ["lmforge generate: error: unknown flag --modle; did you mean --model?"])


def test_a_mistyped_verb_gets_the_closest_verb(capsys):
    code, lines = _run(capsys, ["finetun"])
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("lmforge: error: argument COMMAND: invalid choice: 'finetun'; did you mean 'finetune'?")


def test_an_unknown_task_suggests_its_own_kind(capsys, tmp_path):
    out = tmp_path / "run"
    code = main(["finetune", "--task", "clasify", "--model", "bert-tiny", "--train", "rt-sentiment",
                 "--out", str(out)])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("lmforge finetune: error: unknown task 'clasify'; did you mean 'classify'?")
    assert not out.exists()


@pytest.mark.parametrize("name, meant", [("clasify", "classify"), ("regres", "regress"),
                                         ("glu/cola", "glue/cola"), ("rt-sentimnt", "rt-sentiment")])
def test_task_suggestions_rank_within_the_kind(name, meant):
    from lmforge.errors import UserInputError
    from lmforge.evaluation import benchmarks

    with pytest.raises(UserInputError, match=f"did you mean {meant!r}"):
        benchmarks.get(name)


@pytest.mark.parametrize("name, meant", [("gpt-tny", "gpt-tiny"), ("brt-tiny", "bert-tiny"),
                                         ("gpt2-medum", "gpt2-medium"), ("mixtral-tin", "mixtral-tiny")])
def test_preset_suggestions_rank_within_the_family(name, meant):
    from lmforge.config import ConfigError, ModelConfig

    with pytest.raises(ConfigError, match=f"unknown preset {name!r}; did you mean {meant!r}\\?"):
        ModelConfig.from_preset(name)


def test_a_mistyped_objective_and_method_get_the_closest_choice(capsys):
    code, lines = _run(capsys, ["pretrain", "--objective", "clm2"])
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("lmforge pretrain: error: argument --objective: invalid choice: 'clm2'; "
                               "did you mean 'clm'?")
    code, lines = _run(capsys, ["finetune", "--peft", "lorra"])
    assert code == 2 and len(lines) == 1 and "invalid choice: 'lorra'; did you mean 'lora'?" in lines[0]
