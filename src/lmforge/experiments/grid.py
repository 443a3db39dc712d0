"""Grid files: a lecture's comparison table as data, expanded into cells and checked before anything runs.

A grid names a base command and its settings, axes of variants, seeds, a budget every cell shares and the metrics
to collect; the cells are the cross product of the axes::

    command: pretrain                  # pretrain | finetune | prompt
    settings:                          # that command's settings (TrainConfig keys for pretrain)
      model: gpt-tiny
      objective: clm
      data: data/austen                # relative paths are taken relative to the grid file
      overrides: {n_layers: 2, d_model: 64, n_heads: 4, d_ff: 256, max_seq_len: 64}
      seq_len: 64
    axes:
      - name: position
        variants:
          - {name: learned, overrides: {position: learned}}
          - {name: rope, overrides: {position: rope}}
    seeds: [0, 1]
    budget: {tokens: 2000000}          # steps | tokens | flops (the same for every cell)
    metrics: [eval_loss, eval_ppl, finetune_accuracy]
    finetune:                          # optional second stage: fine-tune each cell's pre-trained model
      task: classify
      train: rt-sentiment:train
      eval: rt-sentiment:dev
      eval_sets: {news: news_dev.tsv}  # further sets, metrics finetune_<NAME>_<metric> (finetune_news_accuracy)
      max_steps: 100
    resources: {num_cpus: 1, num_gpus: 0}   # per cell, for --backend ray
    sizes:                             # named reductions: `--size small` replaces these fields
      small: {budget: {steps: 200}, seeds: [0]}
    claims:                            # optional: what the lecture says the table shows (lmforge.experiments.claims)
      - {id: rope-beats-learned, claim: "...", source: "Su et al. 2021", metric: eval_loss, better: rope,
         than: learned}

A variant is a mapping of the base command's settings (``overrides`` and ``objective_options`` merge key by key
with the base's), plus ``name`` (the cell's label; default: its values), ``finetune`` (settings of the second
stage), ``resources`` (what its cells ask of Ray, over the grid's), ``budget`` (its cells' own budget, in place of
the grid's, which may then be left out: an IsoFLOP sweep gives each model size its own steps) and ``labels`` (plain
values copied into each of its cells' result rows, for the analysis: a sweep cell's planned FLOPs). Budgets
convert to optimizer steps per cell: ``tokens`` / (batch_size x grad_accum x seq_len), and
``flops`` / (the model's :meth:`~lmforge.models.Transformer.train_flops` x batch_size x grad_accum), so cells of
different shapes get the same tokens or compute.

A ``prompt`` grid trains nothing: its settings are ``lmforge prompt generate``'s (one ``model`` and one ``shots``
per cell, e.g. axes over ``cot`` and ``shots``; :data:`~lmforge.prompting.generative.PROMPT_DEFAULTS`), each seed
draws other demonstrations, it has no budget, and its metric is ``prompt_<the task's metric>``.

Every cell's configs are built here, up front (TrainConfig, ModelConfig with its overrides, the objective and its
options, the fine-tuning TaskSpec, Recipe and PeftConfig, the prompting task), so a bad field is one line naming the
grid file, the cell and the field, before any cell runs. A model named by its package (``all-MiniLM-L6-v2``,
:func:`lmforge.checkpoint.model_source`) is looked up here too: ``--dry-run`` lists where it is installed, or that
it is not, and a run without it is refused.

Example:
    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "g.yaml").write_text('''
    ... command: pretrain
    ... settings: {model: gpt-tiny, objective: clm, data: data, overrides: {n_layers: 1, d_model: 32, n_heads: 2}}
    ... axes: [{name: pos, variants: [{overrides: {position: rope}}, {overrides: {position: alibi}}]}]
    ... seeds: [0, 1]
    ... budget: {steps: 20}
    ... ''')
    >>> grid = load_grid(d / "g.yaml")
    >>> [c.id for c in grid.cells], grid.metrics
    (['pos=rope', 'pos=alibi'], ['eval_loss', 'eval_ppl'])
    >>> grid.cells[1].stages["pretrain"]["overrides"]["position"], grid.cells[1].steps
    ('alibi', 20)
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmforge.checkpoint import model_source, packaged_model
from lmforge.config import ConfigBase, ConfigError, ModelConfig, resolve_config
from lmforge.experiments.claims import Claim, parse_claims
from lmforge.errors import InputFileNotFound, LmforgeError, UserInputError
from lmforge.models import Transformer
from lmforge.models.electra import ElectraPretrainer
from lmforge.models.two_stream import two_stream_train_flops
from lmforge.nn.labels import IGNORE_INDEX
from lmforge.objectives import OBJECTIVES, PermutedLM, check_architecture
from lmforge.peft.config import PeftConfig
from lmforge.prompting.generative import METRICS as PROMPT_SCORES
from lmforge.prompting.generative import PROMPT_DEFAULTS, few_shot_rows, few_shot_task
from lmforge.tasks.metrics import LOWER_IS_BETTER
from lmforge.tasks.recipe import Recipe
from lmforge.evaluation.benchmarks import task_settings
from lmforge.tasks.settings import RECIPE_KEYS, TASK_KEYS, TRAINER_KEYS
from lmforge.tasks.spec import TaskSpec
from lmforge.training.config import TrainConfig
from lmforge.training.pretrain import (format_and_options, load_tokenizer, model_config_for, objective_kwargs,
                                      plan_pretraining)
from lmforge.training.price_tag import batch_flops
from lmforge.utils.io import read_mapping_file

COMMANDS = ("pretrain", "finetune", "prompt")  # distill grids are not supported yet
BUDGETS = ("steps", "tokens", "flops")
# What a pre-training run's last evaluation (on the val split) and last step report.
PRETRAIN_METRICS = ("eval_loss", "eval_ppl", "eval_accuracy", "train_loss")
# What the tasks' evaluations report (lmforge.tasks.metrics); a grid asks for them as finetune_<name>.
TASK_METRICS = ("loss", "accuracy", "f1", "f1_macro", "f1_micro", "mcc", "precision", "recall", "subset_accuracy",
                "exact_match", "mse", "pearson", "spearman", "bleu", "chrf")
FINETUNE_METRICS = tuple(f"finetune_{m}" for m in TASK_METRICS)
# What a prompt cell reports: its few-shot score (0-100) at its k and seed.
PROMPT_METRICS = tuple(f"prompt_{m}" for m in PROMPT_SCORES)
# Keys of a prompt cell: `lmforge prompt generate`'s settings; the runner sets seeds and out.
PROMPT_KEYS = tuple(k for k in PROMPT_DEFAULTS if k not in ("seeds", "out"))
# Keys of a fine-tuning stage: the `lmforge finetune` settings (lmforge.tasks.settings), peft as a mapping.
FINETUNE_KEYS = ("model", "tokenizer", "random_init", "train", "eval", "eval_sets", "task", "data_dir", "label_map",
                 "peft", "merge", *TASK_KEYS, *RECIPE_KEYS, *TRAINER_KEYS)
CELL_DEFAULTS = {"progress": False, "tensorboard": False}  # a cell logs to files, not to a terminal
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


class GridError(ConfigError):
    """A grid file is wrong: the message names the file, the cell and the field."""


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of ``metric`` is better (losses, perplexity, mse).

    Example:
        >>> lower_is_better("eval_ppl"), lower_is_better("finetune_accuracy")
        (True, False)
    """
    name = metric.split("_", 1)[1] if metric.startswith(("eval_", "train_", "finetune_", "prompt_")) else metric
    return name in LOWER_IS_BETTER or name == "ppl"


@dataclass
class Budget(ConfigBase):
    """What every cell gets: exactly one of ``steps``, ``tokens``, ``flops`` (``seconds`` is refused: a time budget
    makes cells' results depend on the machine's load)."""

    config_noun = "budget field(s)"
    steps: int | None = None
    tokens: int | None = None
    flops: float | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        self.check_kinds()
        if self.seconds is not None:
            raise ConfigError("budget: seconds is not supported (a time budget gives each cell what the machine's load "
                              "leaves it); give steps, tokens or flops")
        given = [k for k in BUDGETS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ConfigError(f"budget: give exactly one of {', '.join(BUDGETS)}"
                              + (f" (got {', '.join(given)})" if given else ""))
        if not getattr(self, given[0]) > 0:
            raise ConfigError(f"budget: {given[0]}={getattr(self, given[0])!r} must be > 0")

    @property
    def kind(self) -> str:
        return next(k for k in BUDGETS if getattr(self, k) is not None)


@dataclass
class Resources(ConfigBase):
    """What one cell asks of a Ray cluster (and, locally, ``num_cpus`` sets nothing: see ``--workers``)."""

    config_noun = "resources field(s)"
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        self.check_kinds()
        if self.num_cpus <= 0 or self.num_gpus < 0:
            raise ConfigError(f"resources: num_cpus={self.num_cpus} must be > 0 and num_gpus={self.num_gpus} >= 0")


@dataclass
class GridFile(ConfigBase):
    """The fields of a grid file (see the module docstring)."""

    config_noun = "grid field(s)"
    config_file_kind = "grid"
    command: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    axes: list = field(default_factory=list)
    seeds: list = field(default_factory=lambda: [0])
    budget: dict[str, Any] = field(default_factory=dict)
    metrics: list = field(default_factory=list)
    finetune: dict[str, Any] | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    claims: list = field(default_factory=list)  # checked against the cells in load_grid; they change no cell

    def __post_init__(self) -> None:
        self.check_kinds()
        for key in ("axes", "seeds", "metrics", "claims"):
            if not isinstance(getattr(self, key), list):
                raise ConfigError(f"{key}={getattr(self, key)!r} must be a list")


@dataclass
class Cell:
    """One point of the grid: its id (``axis=variant,...``), the variant of each axis, each stage's settings
    (``pretrain``: TrainConfig fields; ``finetune``: fine-tuning settings), its per-step cost and what it asks of
    a Ray cluster."""

    id: str
    axes: dict[str, str]
    stages: dict[str, dict[str, Any]]
    steps: int
    tokens_per_step: int | None = None
    flops_per_step: int | None = None
    resources: Resources = field(default_factory=Resources)
    params: int | None = None  # non-embedding parameters of the pre-trained model (N as Chinchilla counts it)
    labels: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """What the cell does, for ``--dry-run``: its steps (and tokens, FLOPs), or its prompts."""
        if "prompt" in self.stages:
            prompt = self.stages["prompt"]
            return f"{prompt['shots']}-shot{', chain-of-thought' if prompt.get('cot') else ''}, " \
                   f"{prompt.get('limit', PROMPT_DEFAULTS['limit'])} queries"
        extra = [f"{self.steps} steps"]
        if self.tokens_per_step:
            extra.append(f"{self.tokens_per_step * self.steps:,} tokens")
        if self.flops_per_step:
            extra.append(f"{self.flops_per_step * self.steps:.3g} FLOPs")
        return ", ".join(extra) + (" + finetune" if "finetune" in self.stages and self.stages.keys() != {"finetune"}
                                   else "")


@dataclass
class Grid:
    """A checked grid: its cells (in order), seeds, metrics and per-cell resources."""

    path: Path
    command: str
    size: str | None
    cells: list[Cell]
    seeds: list[int]
    metrics: list[str]
    budget: Budget | None  # None: a prompt grid trains nothing, or every cell has its variant's own
    resources: Resources
    raw: dict[str, Any]
    models: dict[str, str] = field(default_factory=dict)  # a packaged model's name -> its folder, or why it is absent
    claims: list[Claim] = field(default_factory=list)  # the lecture's claims the report judges

    @property
    def axes(self) -> list[str]:
        return list(self.cells[0].axes) if self.cells else []

    def runs(self) -> list[tuple[Cell, int]]:
        """Every (cell, seed), cell-major: the order of results.jsonl."""
        return [(cell, seed) for cell in self.cells for seed in self.seeds]

    def listing(self) -> str:
        """One line per cell: id, steps, what the budget converts to (for ``--dry-run``)."""
        budget = (f"budget {self.budget.kind}" if self.budget else
                  "no training" if self.command == "prompt" else "budget per cell")
        lines = [f"{self.path}: {self.command}, {len(self.cells)} cell(s) x {len(self.seeds)} seed(s) "
                 f"{self.seeds}, {budget}, metrics {', '.join(self.metrics)}"]
        lines += [f"  {cell.id}: {cell.summary()}" for cell in self.cells]
        lines += [f"  model {name}: {where}" for name, where in self.models.items()]
        lines += [f"  claim {c.id}: {c.direction()} ({len(c.pairs)} pair{'s' if len(c.pairs) > 1 else ''})"
                  for c in self.claims]
        return "\n".join(lines)

    def check_models(self) -> None:
        """Refuse to run without a packaged model the cells need (``--dry-run`` only lists it)."""
        for name in self.models:
            try:
                model_source(name)
            except InputFileNotFound as exc:
                raise GridError(f"{self.path}: model: {exc}") from exc


# ------------------------------------------------------------------------------------------- reading
def read_grid(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a grid file; errors (missing, not YAML, not a mapping) name the file."""
    try:
        data = read_mapping_file(path, "grid", yaml_always=True)
    except UserInputError as exc:
        mark = getattr(exc.__cause__, "problem_mark", None)
        if mark is None:
            raise
        # one line: PyYAML's message spans several, with a drawing of the spot
        raise GridError(f"{path}: not valid YAML: {exc.__cause__.problem} at line {mark.line + 1}, column "
                        f"{mark.column + 1}") from exc
    if not isinstance(data, dict):
        raise GridError(f"{path}: expected a mapping of grid fields (command, settings, axes, ...), "
                        f"got {type(data).__name__}")
    return data


def load_grid(path: str | Path, size: str | None = None, raw: dict[str, Any] | None = None) -> Grid:
    """Read, expand and check the grid file ``path`` (``size``: apply one of its ``sizes``); ``raw`` parses given
    text instead of the file (a stored copy), still resolving relative paths against ``path``'s folder.

    Raises:
        GridError: one line naming the file, the cell and the field.
    """
    path = Path(path)
    data = dict(read_grid(path) if raw is None else raw)
    try:
        spec = GridFile.from_dict(data, source=str(path))
    except ConfigError as exc:
        raise GridError(_sourced(path, exc)) from exc
    if size is not None:
        spec = _sized(path, spec, size)
    if spec.command not in COMMANDS:
        raise GridError(f"{path}: command={spec.command!r} is not a grid command; supported: {', '.join(COMMANDS)} "
                        "(distill grids are not supported yet)")
    if spec.command == "prompt" and (spec.budget or spec.finetune is not None):
        raise GridError(f"{path}: {'budget' if spec.budget else 'finetune'}: a prompt grid trains nothing; remove it")
    try:
        budget = None if spec.command == "prompt" or (not spec.budget and _every_cell_budgeted(spec.axes)) else \
            _budget(f"{path}: budget", spec.command, spec.budget)
        resources = Resources.from_dict(spec.resources, source=f"{path}: resources")
    except ConfigError as exc:
        raise GridError(_sourced(path, exc)) from exc
    if spec.command == "finetune" and spec.finetune is not None:
        raise GridError(f"{path}: finetune: a finetune grid has no second stage; put its settings under settings")
    seeds = _seeds(path, spec.seeds)
    axes = _axes(path, spec.axes)
    stages = ["pretrain", "finetune"] if spec.command == "pretrain" and spec.finetune is not None else [spec.command]
    metrics = _metrics(path, spec, stages)
    base = _resolve_paths(path.parent, spec.settings)
    second = _resolve_paths(path.parent, spec.finetune or {})
    cells = []
    for combo in itertools.product(*[[(axis, v) for v in variants] for axis, variants in axes]):
        cell_id = ",".join(f"{axis}={v['name']}" for axis, v in combo) or "base"
        where = f"{path}: cell {cell_id}"
        variants = [{k: val for k, val in v.items() if k not in ("name", "budget", "labels")} for _, v in combo]
        own = [v["budget"] for _, v in combo if "budget" in v]
        try:
            cell_budget = _budget(f"{where}: budget", spec.command, own[-1]) if own else budget
        except ConfigError as exc:
            raise GridError(_sourced(path, exc)) from exc
        cell = _cell(where, spec.command, cell_id, {a: v["name"] for a, v in combo}, base, second, variants,
                     cell_budget, metrics, path.parent)
        cell.resources = _cell_resources(where, spec.resources, variants)
        cell.labels = _labels(where, [v.get("labels") for _, v in combo])
        cells.append(cell)
    models = _packaged_models(cells)
    try:
        claims = parse_claims(path, spec.claims, {cell.id: cell.axes for cell in cells}, metrics)
    except ConfigError as exc:
        raise GridError(_sourced(path, exc)) from exc
    return Grid(path, spec.command, size, cells, seeds, metrics, budget, resources, data, models, claims)


def _packaged_models(cells: list[Cell]) -> dict[str, str]:
    """The packaged models the cells name (see :func:`lmforge.checkpoint.model_source`): where each is installed,
    or the line that says how to install it."""
    found: dict[str, str] = {}
    for cell in cells:
        for stage in cell.stages.values():
            name = stage.get("model")
            if name in found or packaged_model(name) is None:
                continue
            try:
                found[name] = str(model_source(name))
            except InputFileNotFound as exc:
                found[name] = f"not installed ({str(exc).split('; ', 1)[-1]}); a run is refused until it is"
    return found


def _budget(where: str, command: str, given: Any) -> Budget:
    """A checked budget mapping (the grid's or a variant's); a finetune grid's is in steps."""
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: expected a mapping of one of {', '.join(BUDGETS)}, got {given!r}")
    budget = Budget.from_dict(given, source=where)
    if command == "finetune" and budget.kind != "steps":
        raise ConfigError(f"{where}: {budget.kind} is supported for pretrain grids only; give a finetune grid steps")
    return budget


def _every_cell_budgeted(axes: list) -> bool:
    """Whether some axis gives each of its variants a ``budget:`` (then the grid itself needs none)."""
    return any(isinstance(axis, dict) and isinstance(axis.get("variants"), list) and axis["variants"]
               and all(isinstance(v, dict) and "budget" in v for v in axis["variants"]) for axis in axes)


def _labels(where: str, given: list[Any]) -> dict[str, Any]:
    """The variants' ``labels:`` merged: a mapping of names to plain values (numbers, strings, booleans)."""
    labels: dict[str, Any] = {}
    for mapping in given:
        if mapping is None:
            continue
        plain = isinstance(mapping, dict) and all(
            isinstance(k, str) and (v is None or isinstance(v, (int, float, str, bool))) for k, v in mapping.items())
        if not plain:
            raise GridError(f"{where}: labels: expected a mapping of names to numbers or strings, got {mapping!r}")
        labels.update(mapping)
    return labels


def _cell_resources(where: str, base: dict[str, Any], variants: list[dict[str, Any]]) -> Resources:
    """The grid's ``resources`` with the variants' ``resources:`` over them (a bigger model asks for a GPU)."""
    merged = dict(base)
    for variant in variants:
        merged.update(variant.get("resources") or {})
    try:
        return Resources.from_dict(merged, source=f"{where}: resources")
    except ConfigError as exc:
        raise GridError(_sourced(Path(where), exc)) from exc


def _sourced(path: Path, exc: Exception) -> str:
    text = str(exc)
    return text if text.startswith(str(path)) else f"{path}: {text}"


def _sized(path: Path, spec: GridFile, size: str) -> GridFile:
    sizes = spec.sizes or {}
    if size not in sizes:
        raise GridError(f"{path}: no size {size!r}; the grid's sizes: {', '.join(sizes) or 'none'}")
    changes = sizes[size] or {}
    allowed = ("settings", "finetune", "seeds", "budget", "resources", "metrics")
    if not isinstance(changes, dict) or set(changes) - set(allowed):
        raise GridError(f"{path}: sizes: {size}: expected a mapping of {', '.join(allowed)}")
    fields_ = spec.to_dict()
    for key, value in changes.items():
        if key in ("settings", "finetune") and isinstance(value, dict):
            fields_[key] = _merged(fields_[key] or {}, value)
        else:
            fields_[key] = value
    return GridFile.from_dict(fields_, source=f"{path}: sizes: {size}")


def _merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """``change`` over ``base``, mappings merged key by key (as TrainConfig merges ``overrides``)."""
    out = dict(base)
    for key, value in change.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _seeds(path: Path, seeds: list) -> list[int]:
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise GridError(f"{path}: seeds={seeds!r} must be a list of distinct integers >= 0, e.g. [0, 1, 2]")
    return list(seeds)


def _axes(path: Path, axes: list) -> list[tuple[str, list[dict[str, Any]]]]:
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for i, axis in enumerate(axes):
        if not isinstance(axis, dict) or set(axis) != {"name", "variants"}:
            raise GridError(f"{path}: axes[{i}]: expected a mapping with name and variants, got {axis!r}")
        name, variants = axis["name"], axis["variants"]
        if not isinstance(name, str) or not NAME.match(name) or name in [a for a, _ in out]:
            raise GridError(f"{path}: axes[{i}]: name={name!r} must be a new name of letters, digits, . _ + -")
        if not isinstance(variants, list) or not variants:
            raise GridError(f"{path}: axis {name}: variants must be a non-empty list of mappings")
        named = []
        for j, variant in enumerate(variants):
            if not isinstance(variant, dict):
                raise GridError(f"{path}: axis {name}: variants[{j}]: expected a mapping of settings, got {variant!r}")
            label = str(variant.get("name", "")) or _label(variant)
            if not NAME.match(label):
                raise GridError(f"{path}: axis {name}: variants[{j}]: name={label!r} must use letters, digits, . _ + - "
                                "(give the variant a name:)")
            if label in [v["name"] for v in named]:
                raise GridError(f"{path}: axis {name}: two variants are named {label!r}; give them distinct names")
            named.append({**variant, "name": label})
        out.append((name, named))
    return out


def _label(variant: dict[str, Any]) -> str:
    """A variant's default name: its leaf values joined by ``-`` (``{overrides: {position: rope}}`` -> rope)."""
    leaves: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            leaves.append("+".join(map(str, value)))
        else:
            leaves.append(str(value))

    walk(variant)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", "-".join(leaves))


def _eval_set_names(settings: Any) -> list[str]:
    """The names of a fine-tuning stage's ``eval_sets`` (a mapping NAME: FILE, or a list of ``NAME=FILE``)."""
    sets = settings.get("eval_sets") if isinstance(settings, dict) else None
    if isinstance(sets, dict):
        return [str(k) for k in sets]
    return [str(e).partition("=")[0].strip() for e in sets] if isinstance(sets, list) else []


def _set_metrics(names: list[str]) -> tuple[str, ...]:
    """What further evaluation sets report, as a grid asks for them: ``finetune_<NAME>_<metric>``."""
    return tuple(f"finetune_{name}_{m}" for name in names for m in TASK_METRICS)


def _metrics(path: Path, spec: GridFile, stages: list[str]) -> list[str]:
    names = []  # the eval sets of the fine-tuning stage, its own or any variant's
    if "finetune" in stages:
        stage = spec.finetune if spec.command == "pretrain" else spec.settings
        names += _eval_set_names(stage)
        for axis in spec.axes:
            for variant in (axis.get("variants") or []) if isinstance(axis, dict) else []:
                names += _eval_set_names(variant.get("finetune") if spec.command == "pretrain" else variant)
    known = (PRETRAIN_METRICS if "pretrain" in stages else ()) + (FINETUNE_METRICS if "finetune" in stages else ()) \
        + _set_metrics(list(dict.fromkeys(names))) + (PROMPT_METRICS if "prompt" in stages else ())
    metrics = spec.metrics or (["eval_loss", "eval_ppl"] if "pretrain" in stages else [])
    if not metrics:
        raise GridError(f"{path}: metrics: name at least one of {', '.join(known)}")
    for metric in metrics:
        if metric not in known:
            raise GridError(f"{path}: metrics: unknown metric {metric!r} for a {' + '.join(stages)} grid; "
                            f"known: {', '.join(known)}")
    if len(set(metrics)) != len(metrics):
        raise GridError(f"{path}: metrics: {metrics} names a metric twice")
    return list(metrics)


def _resolve_paths(folder: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Relative file paths in settings, taken relative to the grid file's folder when they exist there."""
    out = dict(settings)
    def resolved(value):
        if isinstance(value, str) and value and not Path(value).is_absolute() and (folder / value).exists():
            return str((folder / value).resolve())
        head, sep, split = value.rpartition(":") if isinstance(value, str) else ("", "", "")
        if sep and head and not Path(head).is_absolute() and (folder / head).is_dir():  # a dataset folder's split
            return f"{(folder / head).resolve()}:{split}"
        return value

    for key in ("data", "tokenizer", "model", "train", "eval", "pool", "data_dir"):
        if key in out:
            out[key] = resolved(out[key])
    if isinstance(out.get("eval_sets"), dict):
        out["eval_sets"] = {name: resolved(file) for name, file in out["eval_sets"].items()}
    return out


# ------------------------------------------------------------------------------------------- one cell
def _cell(where: str, command: str, cell_id: str, axes: dict[str, str], base: dict[str, Any], second: dict[str, Any],
          variants: list[dict[str, Any]], budget: Budget, metrics: list[str], folder: Path) -> Cell:
    stages: dict[str, dict[str, Any]] = {}
    main, tuned = dict(base), dict(second)
    for variant in variants:
        variant = _resolve_paths(folder, {k: v for k, v in variant.items() if k != "resources"})
        if "finetune" in variant:
            if command != "pretrain" or not isinstance(variant["finetune"], dict) or not second:
                raise GridError(f"{where}: finetune: a variant's finetune settings need a pretrain grid with a "
                                "finetune: stage")
            tuned = _merged(tuned, _resolve_paths(folder, variant.pop("finetune")))
        main = _merged(main, variant)
    if budget is None and command != "prompt":
        raise GridError(f"{where}: budget: give the grid a budget (exactly one of {', '.join(BUDGETS)}), or every "
                        "variant of an axis its own")
    if command == "pretrain":
        config, tokens, flops, params = _pretrain_config(where, main, budget, metrics)
        # The runner sets these per cell x seed; leaving them out keeps a row's settings the cell's own.
        stages["pretrain"] = {k: v for k, v in config.to_dict().items() if k not in ("out", "resume", "seed")}
        steps = config.max_steps
        if second:
            stages["finetune"] = _finetune_settings(f"{where}: finetune", tuned, None, metrics, chained=True)
        return Cell(cell_id, axes, stages, steps, tokens, flops, params=params)
    if command == "prompt":
        stages["prompt"] = _prompt_settings(where, main, metrics)
        return Cell(cell_id, axes, stages, 0)
    stages["finetune"] = _finetune_settings(where, main, budget.steps, metrics, chained=False)
    return Cell(cell_id, axes, stages, budget.steps)


def _pretrain_config(where: str, settings: dict[str, Any], budget: Budget,
                     metrics: list[str]) -> tuple[TrainConfig, int | None, int | None, int | None]:
    """The cell's TrainConfig with ``max_steps`` from the budget, its tokens and FLOPs per optimizer step, and
    its model's non-embedding parameters."""
    for key in ("out", "resume"):
        if key in settings:
            raise GridError(f"{where}: {key}: set by the runner (each cell has its own run folder)")
    objective = settings.get("objective")
    if objective is not None and objective not in OBJECTIVES:
        raise GridError(f"{where}: objective={objective!r}: lmforge has no such objective, so the grid names a "
                        f"method that does not exist yet; known: {', '.join(OBJECTIVES)}")
    if budget.kind == "steps":  # known already: the schedule's fields (warmup) are checked against it
        settings = {**settings, "max_steps": budget.steps}
    try:
        config = TrainConfig.from_dict({**CELL_DEFAULTS, **settings}, source=where)
        config.require("model", "objective", "data", source=where)
    except ConfigError as exc:
        raise GridError(_sourced(Path(where), exc)) from exc
    model_config, tokenizer = _model_config(where, config)
    try:
        check_architecture(config.objective, model_config.arch)
    except ValueError as exc:
        raise GridError(f"{where}: objective: {exc}") from exc
    _check_objective_options(where, config, tokenizer)
    seq_len = config.seq_len or model_config.max_seq_len
    if seq_len > model_config.max_seq_len:
        raise GridError(f"{where}: seq_len={seq_len} exceeds the model's max_seq_len={model_config.max_seq_len}; "
                        "lower seq_len or set overrides: {max_seq_len: ...}")
    sequences = config.batch_size * config.grad_accum
    tokens = sequences * seq_len
    flops, params = None, None
    if isinstance(model_config, ModelConfig):
        per_sequence, params = _train_flops(model_config, seq_len, config)
        counted = _counted_step_flops(where, config, tokenizer) if tokenizer is not None else None
        flops = counted or per_sequence * sequences
    if budget.kind == "steps":
        steps = budget.steps
    elif budget.kind == "tokens":
        steps = budget.tokens // tokens
    else:
        if flops is None:
            raise GridError(f"{where}: budget: flops needs a Transformer (no FLOP count for {config.model!r}); "
                            "give steps or tokens")
        steps = int(budget.flops // flops)
    if steps < 1:
        raise GridError(f"{where}: budget: {budget.kind}={getattr(budget, budget.kind):g} is less than one step of "
                        f"this cell ({tokens:,} tokens, {flops or 0:.3g} FLOPs)")
    try:
        config = config.updated({"max_steps": steps}, source=where)
    except ConfigError as exc:
        raise GridError(_sourced(Path(where), exc)) from exc
    if any(m.startswith("eval_") for m in metrics) and not config.eval_every:
        raise GridError(f"{where}: eval_every=0, but the metrics ask for the validation loss; set eval_every > 0")
    return config, tokens, flops, params


def _model_config(where: str, config: TrainConfig):
    """The cell's ModelConfig (the tokenizer's ids and vocabulary when the data is prepared already)."""
    tokenizer = None
    try:
        if (Path(config.data) / "manifest.json").is_file():
            tokenizer = load_tokenizer(config)
            return model_config_for(config.model, tokenizer, config.overrides), tokenizer
        base = resolve_config(config.model)
        return ModelConfig.from_dict({**base.to_dict(), **config.overrides}, source="overrides"), None
    except ConfigError as exc:
        message = str(exc).replace("model overrides: ", "").replace("overrides: ", "")
        raise GridError(f"{where}: overrides: {message}") from exc
    except LmforgeError as exc:
        raise GridError(f"{where}: model={config.model!r}: {exc}") from exc


def _check_objective_options(where: str, config: TrainConfig, tokenizer) -> None:
    try:
        _, options = format_and_options(config.objective, config.objective_options)
        if tokenizer is not None:
            objective_kwargs(config.objective, tokenizer, config.seed, options)
            return
    except ConfigError as exc:
        raise GridError(f"{where}: {exc}") from exc
    params = inspect.signature(OBJECTIVES[config.objective]).parameters
    for key in options:
        if key not in params:
            raise GridError(f"{where}: objective_options: {config.objective!r} has no option {key!r}; "
                            f"it takes {', '.join(p for p in params if p != 'seed')}")


def _counted_step_flops(where: str, config: TrainConfig, tokenizer, samples: int = 8) -> int | None:
    """Training FLOPs of one optimizer step as the run's price tag will count them: the mean over the objective's
    first ``samples`` training batches of :func:`~lmforge.training.price_tag.batch_flops`, which reads each batch's
    real lengths (a span-corruption target is about a fifth of its input; a decoder's denoising or prefix-LM
    sequence carries labels on its target part only, and only labelled rows reach the vocabulary projection).
    ``seq_len`` alone would charge every objective as if it labelled every position of a full-length target, so
    a FLOPs budget would not give equal compute. None where the price tag has no formula (ELECTRA's pair, XLNet's
    two streams: the analytic count of :func:`_train_flops` stands) or the data yields no batch."""
    if config.objective == "electra" or OBJECTIVES[config.objective] is PermutedLM:
        return None
    try:
        plan = plan_pretraining(config.updated({"num_workers": 0}), tokenizer=tokenizer)
    except LmforgeError as exc:
        raise GridError(f"{where}: {exc}") from exc
    if not isinstance(plan.model_config, ModelConfig):
        return None
    with torch.device("meta"):
        model = Transformer(plan.model_config)
    cache: dict[Any, int] = {}
    counts = []
    for raw in itertools.islice(plan.train_data, samples * config.grad_accum):
        batch = plan.objective(raw)
        labels = batch.get("labels")
        n = int((labels != IGNORE_INDEX).sum()) if isinstance(labels, torch.Tensor) else 0
        counted = batch_flops(model, batch, n, cache)
        if counted is None:
            return None
        counts.append(counted)
    return round(sum(counts) / len(counts) * config.grad_accum) if counts else None


def _objective_option(config: TrainConfig, key: str, defined_by: str | None = None) -> Any:
    """The value ``key`` takes in the cell's objective: its ``objective_options``, else the default of the
    objective class ``defined_by`` (default: the cell's own; ELECTRA's masking options are MLM's)."""
    _, options = format_and_options(config.objective, config.objective_options)
    return options.get(key, inspect.signature(OBJECTIVES[defined_by or config.objective]).parameters[key].default)


def _train_flops(model_config: ModelConfig, seq_len: int, config: TrainConfig | None = None) -> tuple[int, int]:
    """Training FLOPs of one sequence and the non-embedding parameter count, read off a model built without
    memory (the meta device). ELECTRA trains its generator beside the model: a FLOPs budget pays for both (the
    parameter count stays the saved discriminator's), the generator's vocabulary projection on the masked share
    of the positions only (``ElectraPretrainer.train_flops``); XLNet's permuted LM runs two streams
    (``two_stream_train_flops``)."""
    with torch.device("meta"):
        if config is not None and config.objective == "electra":  # the pair pretrain builds
            pair = ElectraPretrainer.from_config(model_config,
                                                 generator_size=_objective_option(config, "generator_size"),
                                                 tie_generator_output=_objective_option(config, "tie_generator_output"))
            return (pair.train_flops(seq_len, _objective_option(config, "mlm_probability", "mlm")),
                    pair.discriminator.num_parameters(True))
        model = Transformer(model_config)
    if config is not None and OBJECTIVES[config.objective] is PermutedLM:
        predicted = seq_len / _objective_option(config, "partial_k")  # the last 1/K of each order
        return two_stream_train_flops(model, seq_len, predicted), model.num_parameters(True)
    return (model.train_flops(seq_len, seq_len if model_config.arch == "encoder-decoder" else None),
            model.num_parameters(True))


def _finetune_settings(where: str, given: dict[str, Any], steps: int | None, metrics: list[str],
                       chained: bool) -> dict[str, Any]:
    """Checked fine-tuning settings (the ``given`` form :func:`~lmforge.tasks.settings.finetune_settings` takes;
    ``peft`` a mapping of PeftConfig fields). A chained stage's model is the cell's pre-trained model."""
    unknown = sorted(set(given) - set(FINETUNE_KEYS))
    if unknown:
        raise GridError(f"{where}: unknown fine-tuning setting(s) {', '.join(map(repr, unknown))}; "
                        f"known: {', '.join(FINETUNE_KEYS)}")
    for key in ("out", "resume", "seed"):
        if key in given:
            raise GridError(f"{where}: {key}: set by the runner (each cell has its own run folder and seed)")
    if chained and "model" in given:
        raise GridError(f"{where}: model: a finetune stage fine-tunes the cell's pre-trained model; remove model:")
    given = {**CELL_DEFAULTS, **given}
    if isinstance(given.get("label_map"), dict):  # `--label-map` takes a JSON object as text
        given["label_map"] = json.dumps({str(k): str(v) for k, v in given["label_map"].items()})
    if steps is not None:
        given["max_steps"] = steps
    peft = given.pop("peft", None)
    try:
        if peft is not None:
            if not isinstance(peft, dict):
                raise ConfigError(f"peft={peft!r} must be a mapping of PeftConfig fields, e.g. {{method: lora, r: 8}}")
            peft = PeftConfig.from_dict(peft, source="peft").to_dict()
        # A task by name (task: glue/sst2, data_dir: DIR) resolves as in `lmforge finetune`: its columns, labels,
        # train and eval splits and metric; the cell keeps the name and resolves it again where it runs.
        probe = {**given, "model": given.get("model") or "<pre-trained model>", "out": "<cell>"}
        settings = task_settings(probe)
        TaskSpec.from_dict(settings["task"], source="task")
        recipe = dict(settings["recipe"])
        recipe.pop("epochs", None), recipe.pop("warmup_ratio", None)
        Recipe(**recipe)
        TrainConfig.from_dict(settings["trainer"], source="trainer")
    except (LmforgeError, ValueError, TypeError) as exc:
        raise GridError(f"{where}: {exc}") from exc
    if any(m in FINETUNE_METRICS for m in metrics) and not settings["eval"]:
        raise GridError(f"{where}: eval: the metrics ask for fine-tuning scores; give eval: data to score on")
    sets = _set_metrics(_eval_set_names(given))
    missing = [m for m in metrics if m.startswith("finetune_") and m not in FINETUNE_METRICS and m not in sets]
    if missing:
        raise GridError(f"{where}: eval_sets: the metrics ask for {', '.join(missing)}, but this cell has no such "
                        "evaluation set; give it under eval_sets: {NAME: FILE}")
    if not given.get("eval_every", 1):
        raise GridError(f"{where}: eval_every=0: the fine-tuning stage is scored by its last evaluation")
    return {**{k: v for k, v in given.items() if k != "model" or not chained}, "peft": peft}


def _prompt_settings(where: str, given: dict[str, Any], metrics: list[str]) -> dict[str, Any]:
    """Checked ``prompt generate`` settings of one cell: one model, one k; the task built and, for a shipped task,
    its rows read (a data file is read when the cell runs, as a pre-training grid's data is)."""
    unknown = sorted(set(given) - set(PROMPT_KEYS))
    if unknown:
        runner = [k for k in unknown if k in PROMPT_DEFAULTS]
        if runner:
            raise GridError(f"{where}: {runner[0]}: set by the runner (each seed draws its own demonstrations, each "
                            "cell has its own folder)")
        raise GridError(f"{where}: unknown prompt setting(s) {', '.join(map(repr, unknown))}; known: "
                        f"{', '.join(PROMPT_KEYS)}")
    if not isinstance(given.get("model"), str) or not given["model"]:
        raise GridError(f"{where}: model: give one model folder (or a packaged model's name) per cell")
    shots = given.get("shots")
    if not isinstance(shots, int) or isinstance(shots, bool) or shots < 0:
        raise GridError(f"{where}: shots={shots!r}: give one k >= 0 per cell (an axis over shots for several)")
    for key in ("limit", "max_new_tokens", "batch_size"):
        value = given.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GridError(f"{where}: {key}={value!r} must be an integer >= 1")
    if not isinstance(given.get("cot", False), bool):
        raise GridError(f"{where}: cot={given['cot']!r} must be true or false")
    settings = {**PROMPT_DEFAULTS, **given}
    try:
        task = few_shot_task(settings)
        if settings["task"] is not None:
            pool, _ = few_shot_rows(settings, task)
            if shots > len(pool):
                raise UserInputError(f"shots={shots} is more than the {len(pool)} demonstrations in the pool")
    except LmforgeError as exc:
        raise GridError(f"{where}: {exc}") from exc
    for metric in metrics:
        if metric != f"prompt_{task.metric}":
            raise GridError(f"{where}: metrics: {metric}, but the cell scores its answers by {task.metric} "
                            f"(prompt_{task.metric})")
    return dict(given)


def check_finite(value: Any) -> bool:
    """Whether ``value`` is a finite number (a metric worth a mean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
