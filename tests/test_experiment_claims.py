"""A grid's ``claims:``: checked at load time, invisible to the cells, judged in table.md and report.html (with the
power line and zoomed plots), from tiny results.jsonl fixtures; and the shipped grids' claims name real cells."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml
from experiment_helpers import POSITION_AXIS, grid_text, run_cli, tree_state, write_grid
from test_training_pretrain import prepared

from lmforge.cli.main import main
from lmforge.experiments.grid import GridError, load_grid
from lmforge.experiments.report import metric_figure, summarize, write_report
from lmforge.experiments.runner import check_grid_copy

EXAMPLES = Path(__file__).resolve().parents[1] / "experiments"
THREE_AXIS = {"name": "pos", "variants": [{"name": "rope", "overrides": {"position": "rope"}},
                                          {"name": "alibi", "overrides": {"position": "alibi"}},
                                          {"name": "learned", "overrides": {"position": "learned"}}]}
CLAIM = {"id": "rel", "claim": "Relative beats absolute.", "source": "Shaw et al. 2018, Table 1",
         "metric": "eval_loss", "better": ["rope", "alibi"], "than": "learned", "paper_effect": "+0.3 BLEU"}


def _grid(tmp_path: Path, claims, axes=(THREE_AXIS,)) -> Path:
    # the data folder need not exist to load a grid (it is checked when the grid runs)
    extra = {} if claims is None else {"claims": claims}
    return write_grid(tmp_path, grid_text(tmp_path / "data", list(axes), **extra))


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_grid_loads_with_claims_that_name_its_cells(example):
    grid = load_grid(example, "small")
    assert grid.claims, f"{example.name} has no claims"
    ids = {cell.id for cell in grid.cells}
    for claim in grid.claims:
        assert claim.metric in grid.metrics and claim.source and claim.claim
        assert claim.pairs and all(a in ids and b in ids and a != b for a, b in claim.pairs)
    assert [c.id for c in load_grid(example).claims] == [c.id for c in grid.claims]


def test_a_claim_matching_several_cells_pairs_those_equal_on_the_other_axes(tmp_path):
    shots = {"name": "lr", "variants": [{"name": "low", "lr": 1e-3}, {"name": "high", "lr": 3e-3}]}
    claim = {**CLAIM, "better": "pos=rope", "than": "pos=learned"}
    grid = load_grid(_grid(tmp_path, [claim], axes=(THREE_AXIS, shots)))
    assert grid.claims[0].pairs == [("pos=rope,lr=low", "pos=learned,lr=low"),
                                    ("pos=rope,lr=high", "pos=learned,lr=high")]
    # naming a full cell id, or both axes, pairs exactly what is named
    claim = {**CLAIM, "better": "pos=rope,lr=low", "than": "pos=learned,lr=high"}
    assert load_grid(_grid(tmp_path, [claim], axes=(THREE_AXIS, shots))).claims[0].pairs == \
        [("pos=rope,lr=low", "pos=learned,lr=high")]


@pytest.mark.parametrize("change, message", [
    ({"than": "learnd"}, "claim rel: than: no cell 'learnd' (did you mean 'learned'?)"),
    ({"better": "pos=ropee"}, "claim rel: better: 'pos=ropee': axis pos has no variant 'ropee' (did you mean 'rope'?)"),
    ({"better": "po=rope"}, "claim rel: better: 'po=rope': no axis 'po' (did you mean 'pos'?)"),
    ({"metric": "eval_los"}, "claim rel: metric: 'eval_los' is not one of the grid's metrics (did you mean "
                             "'eval_loss'?)"),
    ({"sorce": "x"}, "claim rel: unknown field 'sorce' (did you mean 'source'?)"),
    ({"source": None}, "claim rel: source: missing"),
    ({"expect": "same"}, "claim rel: margin=None: expect: same needs a margin > 0"),
    ({"margin": 0.1}, "claim rel: margin: only an expect: same claim takes a margin"),
    ({"expect": "worse"}, "claim rel: expect='worse': choose better or same"),
    ({"paper_delta": "+1.3 BLEU"}, "claim rel: paper_delta='+1.3 BLEU' must be a number"),
    ({"better": "learned"}, "claim rel: better/than: no pair of distinct cells to compare"),
    ({"id": "two words"}, "claims[0]: id='two words' must be a short name without spaces"),
])
def test_a_bad_claim_is_one_line_naming_file_claim_and_field(tmp_path, change, message):
    path = _grid(tmp_path, [{**CLAIM, **change}])
    with pytest.raises(GridError) as err:
        load_grid(path)
    text = str(err.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text


def test_two_claims_with_one_id_and_a_claims_field_that_is_not_a_list_are_refused(tmp_path):
    with pytest.raises(GridError, match="claim rel: id: two claims are named 'rel'"):
        load_grid(_grid(tmp_path, [CLAIM, CLAIM]))
    with pytest.raises(GridError, match="claims"):
        load_grid(_grid(tmp_path, {"rel": CLAIM}))


def test_a_variant_name_of_two_axes_must_be_qualified(tmp_path):
    other = {"name": "init", "variants": [{"name": "rope", "lr": 1e-3}, {"name": "x", "lr": 3e-3}]}
    with pytest.raises(GridError, match=r"'rope' is a variant of several axes \(pos, init\); write AXIS=rope"):
        load_grid(_grid(tmp_path, [CLAIM], axes=(THREE_AXIS, other)))


def test_claims_change_no_cell_and_a_finished_folder_takes_them_without_extend(tmp_path):
    old = _grid(tmp_path, None)
    new = write_grid(tmp_path, grid_text(tmp_path / "data", [THREE_AXIS], claims=[CLAIM]), "claimed.yaml")
    before, after = load_grid(old), load_grid(new)
    assert [(c.id, c.stages, c.steps) for c in before.cells] == [(c.id, c.stages, c.steps) for c in after.cells]
    assert before.claims == [] and after.listing().endswith("claim rel: eval_loss: [rope, alibi] better than "
                                                             "learned (2 pairs)")
    out = tmp_path / "out"
    out.mkdir()
    (out / "grid.yaml").write_text(old.read_text())
    (out / "experiment.json").write_text(json.dumps({"size": None}))
    check_grid_copy(after, out, extend=False)  # only claims were added: the experiment resumes
    changed = write_grid(tmp_path, grid_text(tmp_path / "data", [THREE_AXIS], claims=[CLAIM], steps=30), "c.yaml")
    with pytest.raises(Exception, match="differs from the grid"):
        check_grid_copy(load_grid(changed), out, extend=False)


def test_adding_claims_to_a_finished_experiment_runs_nothing_and_reports_them(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    data = prepared(tmp_path / "data", "gpt")
    grid = write_grid(tmp_path, grid_text(data, [POSITION_AXIS], seeds=[0], steps=4))
    out = tmp_path / "out"
    assert run_cli(grid, "--out", out, "--workers", "2", "--threads", "1") == 0
    cells = tree_state(out / "cells")
    claim = {**CLAIM, "better": "rope", "than": "alibi"}
    write_grid(tmp_path, grid_text(data, [POSITION_AXIS], seeds=[0], steps=4, claims=[claim]))
    assert run_cli(grid, "--out", out, "--workers", "2", "--threads", "1") == 0
    assert "0 run(s) to do, 2 already done" in capsys.readouterr().err
    assert tree_state(out / "cells") == cells  # no cell was touched
    assert (out / "table.md").read_text().startswith("## Claims\n\n- **rel**: Relative beats absolute.")
    assert yaml.safe_load((out / "grid.yaml").read_text())["claims"] == [claim]


# ------------------------------------------------------------------------------------------- the report
LOSSES = {"pos=rope": [5.46, 5.49, 5.47], "pos=alibi": [5.63, 5.60, 5.66], "pos=learned": [5.63, 5.66, 5.62]}


def _folder(tmp_path: Path, losses=LOSSES, claims=(CLAIM,), seconds=100.0, grid=True) -> Path:
    """An experiment folder as the runner leaves it, from hand-made rows (no cell runs)."""
    out = tmp_path / "exp"
    out.mkdir()
    cells = list(losses)
    (out / "experiment.json").write_text(json.dumps({"axes": ["pos"], "metrics": ["eval_loss", "eval_ppl"],
                                                     "cells": cells, "seeds": [0, 1, 2], "title": "t"}))
    rows = [{"cell": cell, "seed": seed, "axes": {"pos": cell.split("=")[1]}, "status": "ok",
             "metrics": {"eval_loss": value, "eval_ppl": math.exp(value)}, "seconds": seconds, "threads": 1}
            for cell, values in losses.items() for seed, value in enumerate(values)]
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for cell in cells:  # the run folders, without price tags: the budget comes from the rows' seconds
        (out / "cells" / cell).mkdir(parents=True)
    if grid:
        raw = yaml.safe_load(grid_text(tmp_path / "data", [THREE_AXIS]))
        if claims is not None:
            raw["claims"] = list(claims)
        (out / "grid.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


def test_table_md_opens_with_each_claim_judged_against_the_seeds_noise(tmp_path):
    out = _folder(tmp_path)
    write_report(out)
    text = (out / "table.md").read_text()
    assert text.startswith("## Claims\n")
    # by hand: rope 5.4733 ± 0.01528, learned 5.6367 ± 0.02082; Δ = 0.1633, bound 2·sqrt((σa² + σb²)/3) = 0.0298
    rope = "pos=rope vs pos=learned: Δ = +0.163 nats, detectable ≥ 0.0298 (σ 0.0153/0.0208, 3 seeds): reproduced"
    # alibi 5.63 ± 0.03 against learned: Δ = 0.0067 < bound 2·sqrt((0.0009 + 0.000433)/3) = 0.0422: inconclusive;
    # seeds to detect 0.0067 at these σ: 4 (0.0009 + 0.000433) / 0.0000444 = 120, for each of the two cells
    alibi = ("pos=alibi vs pos=learned: Δ = +0.00667 nats, detectable ≥ 0.0422 (σ 0.03/0.0208, 3 seeds): "
             "inconclusive")
    assert rope in text and alibi in text
    head = next(line for line in text.splitlines() if line.startswith("- **rel**"))
    assert "Relative beats absolute. (Shaw et al. 2018, Table 1; eval_loss: [rope, alibi] better than learned)" in head
    assert "2 pairs: 1 reproduced, 1 inconclusive at this scale" in head and "Paper: +0.3 BLEU" in head
    needed = math.floor(4 * (statistics.stdev(LOSSES["pos=alibi"]) ** 2 + statistics.stdev(LOSSES["pos=learned"]) ** 2)
                        / (statistics.fmean(LOSSES["pos=learned"]) - statistics.fmean(LOSSES["pos=alibi"])) ** 2) + 1
    more = 2 * (needed - 3)
    assert (f"**inconclusive at this scale**; ≈ {needed} seeds per cell would detect the observed difference "
            f"({more} more runs, ≈ {more * 100:,} cell-seconds = {more * 100 / 3600:.2g} CPU-hours).") in head
    # the main table follows, unchanged in form, with the power line under it
    assert "| cell | pos | seeds ok | eval_loss | eval_ppl |" in text
    assert text.index("## Claims") < text.index("| cell |") < text.index("Power (")
    html = (out / "report.html").read_text()
    assert html.index("<h2>Claims</h2>") < html.index("<table>") and "reproduced" in html
    assert "detectable ≥ 0.0298" in html and "median seed σ" in html


def test_the_power_line_gives_the_median_std_and_the_smallest_detectable_difference(tmp_path):
    out = _folder(tmp_path, claims=None)
    write_report(out)
    text = (out / "table.md").read_text()
    assert "## Claims" not in text and text.startswith("| cell |")
    stds = sorted(statistics.stdev(v) for v in LOSSES.values())  # 0.01528, 0.02082, 0.03
    bound = 2 * stds[1] * math.sqrt(2 / 3)
    assert (f"- eval_loss: median seed σ {stds[1]:.3g} over 3 cells of 3 seeds; two cells must differ by ≥ "
            f"{bound:.3g} nats to be told apart") in text


def test_a_folder_from_before_claims_still_reports(tmp_path):
    out = _folder(tmp_path, grid=False)  # no grid.yaml at all
    assert main(["experiment", "report", str(out)]) == 0
    assert (out / "table.md").read_text().startswith("| cell |")
    assert (out / "plots" / "eval_loss.png").read_bytes()[:4] == b"\x89PNG"


def test_report_reads_the_claims_from_the_folders_grid_copy_and_refuses_a_broken_one(tmp_path, capsys):
    out = _folder(tmp_path, claims=[{**CLAIM, "than": "learnt"}])
    assert main(["experiment", "report", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "grid.yaml: claim rel: than: no cell 'learnt' (did you mean 'learned'?)" in err and "\n" not in err
    assert not (out / "table.md").exists()


def test_single_seed_cells_have_no_variance_estimate(tmp_path):
    out = _folder(tmp_path, losses={k: v[:1] for k, v in LOSSES.items()})
    write_report(out)
    text = (out / "table.md").read_text()
    assert "**inconclusive: one seed, no variance estimate**" in text
    assert "- eval_loss: one seed per cell, no variance estimate" in text


def test_same_claims_and_the_paper_delta_set_the_seeds_to_run(tmp_path):
    same = {**CLAIM, "id": "same", "expect": "same", "margin": 0.05, "better": "alibi", "than": "learned"}
    paper = {**CLAIM, "id": "paper", "better": "alibi", "paper_delta": 0.02}
    out = _folder(tmp_path, claims=[same, paper])
    write_report(out)
    lines = {line.split("**")[1]: line for line in (out / "table.md").read_text().splitlines()
             if line.startswith("- **")}
    # |Δ| 0.0067 + bound 0.0422 = 0.049 < 0.05
    assert "margin ±0.05" in lines["same"] and lines["same"].endswith("**reproduced**.")
    sa, sb = statistics.stdev(LOSSES["pos=alibi"]), statistics.stdev(LOSSES["pos=learned"])
    assert f"≈ {math.floor(4 * (sa ** 2 + sb ** 2) / 0.02 ** 2) + 1} seeds per cell would detect the paper's " \
           "difference" in lines["paper"]


def test_the_plot_zooms_to_the_data_instead_of_starting_at_zero():
    rows = [{"cell": c, "seed": s, "axes": {}, "status": "ok", "metrics": {"eval_loss": v + 0.01 * s}}
            for c, v in (("a", 6.2), ("b", 6.3), ("c", 6.38)) for s in range(3)]
    table = summarize(rows, ["a", "b", "c"], ["eval_loss"])
    ax = metric_figure(table, "eval_loss").axes[0]
    low, high = ax.get_ylim()
    lowest = min(e["eval_loss"][0] - e["eval_loss"][1] for e in table)
    highest = max(e["eval_loss"][0] + e["eval_loss"][1] for e in table)
    assert 6.0 < low < lowest and highest < high < 6.6  # zoomed, with a margin: not a bar chart from 0
    assert not ax.patches  # points with error bars, no bars
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
