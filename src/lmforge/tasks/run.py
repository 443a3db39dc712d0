"""One fine-tuning run from its settings (see :mod:`lmforge.tasks.settings`): the pipeline it needs, then --merge.

:func:`run_finetune` routes a run to supervised fine-tuning of a decoder on instructions (``task: instruct``,
:mod:`lmforge.prompting.instruct`) or to task fine-tuning (:func:`lmforge.tasks.finetune.finetune`), with or
without a PEFT adapter. A task run writes ``OUT/finetune.yaml`` first, so ``--resume`` finds its settings, and
refuses a folder that already holds another run; it writes the file only once every check has passed and the
Trainer holds the folder's lock, so a refused run leaves the folder as it was. With ``merge`` it then folds the adapter into ``OUT/merged``.

Example (a sketch: it trains)::

    settings = finetune_settings({"model": "minilm", "task": "classify", "train": "rt-sentiment:train",
                                  "out": "runs/rt", "peft": "lora", "merge": True})
    run = run_finetune(settings)
    run.merged  # runs/rt/merged
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from lmforge.errors import UserInputError
from lmforge.peft.config import PeftConfig
from lmforge.prompting.instruct import finetune_instruct_from_settings
from lmforge.tasks.finetune import finetune
from lmforge.tasks.peft import merge_task_folder
from lmforge.tasks.recipe import Recipe
from lmforge.tasks.settings import SETTINGS_FILE, save_settings
from lmforge.tasks.spec import TaskSpec
from lmforge.training.config import TrainConfig
from lmforge.training.trainer import TrainResult, check_fresh_run

MERGED_DIR = "merged"  # merge: a plain task folder with the PEFT adapter folded in


@dataclass
class FinetuneRun:
    """What :func:`run_finetune` did: the last step, the final model folder, the best evaluation (task runs
    with an evaluation set), the signal that stopped it early (``SIGINT``/``SIGTERM``), the merged folder and the
    further evaluation sets' last scores ({NAME: {metric: value, "step": step}})."""

    out: Path
    step: int
    model_dir: Path | None  # None when a signal stopped the run before the end
    best: dict[str, Any] | None = None
    stopped_by: str | None = None
    merged: Path | None = None
    merged_from: Path | None = None
    train: TrainResult | None = None  # the Trainer's own result: loop time, tokens, checkpoint sizes
    eval_sets: dict[str, dict[str, Any]] | None = None


def _log_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def run_finetune(settings: dict[str, Any], *, pack: bool = False,
                 log: Callable[[str], None] = _log_stderr) -> FinetuneRun:
    """Run the fine-tuning ``settings`` describe (``pack``: instruct runs pack short examples); ``log`` gets
    progress lines."""
    task_name = settings["task"].get("task")
    if task_name == "instruct":
        if settings["peft"]:
            raise UserInputError("--peft is not supported with --task instruct (it has its own recipe)")
        if settings.get("eval_sets"):
            raise UserInputError("--eval-set is not supported with --task instruct (it has its own recipe)")
        result = finetune_instruct_from_settings(settings, pack=pack)
        # An instruct run keeps no finetune.yaml to resume from, so it reports no stopping signal either.
        return FinetuneRun(Path(settings["out"]), result.step, Path(result.model_dir), train=result)
    recipe_settings = dict(settings["recipe"])
    epochs, warmup_ratio = recipe_settings.pop("epochs", None), recipe_settings.pop("warmup_ratio", None)
    spec = TaskSpec.from_dict(settings["task"], source="command line")
    recipe = Recipe(**recipe_settings)
    config = TrainConfig.from_dict({**settings["trainer"], "model": str(settings["model"]), "out": settings["out"]},
                                   source="command line")
    out = Path(settings["out"])
    check_fresh_run(out, config.resume)
    peft = PeftConfig.from_dict(settings["peft"], source=f"{out / SETTINGS_FILE}: peft") if settings["peft"] else None
    if peft is not None and recipe.freeze_body:
        raise UserInputError("--freeze-body trains the head only; it cannot be combined with --peft")
    result = finetune(settings["model"], spec, settings["train"], settings["eval"], config=config, recipe=recipe,
                      out=out, tokenizer=settings["tokenizer"], random_init=settings["random_init"],
                      epochs=epochs, warmup_ratio=warmup_ratio, peft=peft, log=log,
                      on_start=lambda: save_settings(settings), eval_sets=settings.get("eval_sets"))
    train = result.train
    run = FinetuneRun(out, train.step, Path(train.model_dir) if train.model_dir else None, best=result.best,
                      stopped_by=train.stopped_by, train=train, eval_sets=result.eval_sets)
    if settings["merge"] and train.stopped_by not in ("SIGINT", "SIGTERM"):
        run.merged_from = out / "best" if result.best else Path(train.model_dir)
        run.merged = Path(merge_task_folder(run.merged_from, out / MERGED_DIR))
    return run
