"""Checkpoint averaging (Vaswani et al. 2017, §6.1): the weights of the last K checkpoints, averaged.

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which were
written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints." The average of
parameters late in training sits nearer the centre of the region the optimizer wanders in, which usually
scores better than any one of them (the idea Polyak averaging and SWA share).

Every floating-point tensor of the model's state is the element-wise mean of the K checkpoints' tensors,
computed in float64 and cast back; other tensors (integer buffers) are taken from the newest checkpoint.
The checkpoints must belong to one run (same config); each is verified against its checksums first. The
result is an ordinary model folder, written atomically.

Example:
    >>> import pathlib, tempfile, torch, lmforge
    >>> from lmforge.training.state import CheckpointManager
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> model = lmforge.build_model("gpt-tiny", n_layers=1)
    >>> manager = CheckpointManager(run / "checkpoints", keep=5)
    >>> for step in (1, 2):
    ...     with torch.no_grad():
    ...         _ = model.embed_tokens.weight.fill_(step)
    ...     _ = manager.save(step, model, torch.optim.AdamW(model.parameters()), {})
    >>> out = average_checkpoints(run, last=2, dst=run / "averaged")
    >>> float(lmforge.load(out).embed_tokens.weight[0, 0].detach())
    1.5
"""

from __future__ import annotations

from pathlib import Path

import torch

from lmforge.errors import UserInputError
from lmforge.objectives.multilingual_denoising import LANGUAGES_FILE
from lmforge.training.dist_checkpoint import RUN_CHECKPOINTS, RUN_MODEL, checkpoint_model, write_model_folder
from lmforge.training.state import CheckpointManager, verify_checkpoint


def last_checkpoints(run: str | Path, last: int) -> list[Path]:
    """The newest ``last`` checkpoint folders of a run folder (or its ``checkpoints`` folder), oldest first."""
    run = Path(run)
    if last < 1:
        raise UserInputError(f"--last {last}: average at least 1 checkpoint")
    root = run / RUN_CHECKPOINTS if (run / RUN_CHECKPOINTS).is_dir() else run
    if not root.is_dir():
        raise UserInputError(f"{run}: no such run folder or checkpoints folder")
    manager = CheckpointManager(root)
    steps = manager.steps()
    if len(steps) < last:
        raise UserInputError(f"{run}: --last {last} asks for more checkpoints than the {len(steps)} it holds "
                             f"({', '.join(manager.path(s).name for s in steps) or 'none'})")
    folders = [manager.path(s) for s in steps[-last:]]
    for folder in folders:
        verify_checkpoint(folder)
    return folders


def average_state(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of each floating-point tensor over ``states`` (non-float ones from the last)."""
    out = {}
    for name, newest in states[-1].items():
        if newest.is_floating_point():
            total = sum(state[name].to(torch.float64) for state in states)
            out[name] = (total / len(states)).to(newest.dtype)
        else:
            out[name] = newest
    return out


def average_checkpoints(run: str | Path, last: int, dst: str | Path, tokenizer: str | Path | None = None) -> Path:
    """Average the weights of ``run``'s last ``last`` checkpoints into the model folder ``dst`` (returned).
    ``tokenizer``: a tokenizer folder to include; default the run's own."""
    folders = last_checkpoints(run, last)
    models = [checkpoint_model(folder) for folder in folders]
    configs = {str(m.config.to_dict()) for m in models}
    if len(configs) > 1:
        raise UserInputError(f"{run}: the last {last} checkpoints have different model configs; they are not one run")
    model = models[-1]
    model.load_state_dict(average_state([m.state_dict() for m in models]))
    return write_model_folder(folders[-1], dst, tokenizer, model=model, extra_files=run_files(folders[-1]))


# Files a finished run writes beside its final weights that say how to use them: a fine-tuning run's task
# (lmforge.tasks.model.TASK_FILE) and a multilingual run's language ids (objectives.multilingual_denoising).
RUN_FILES = ("task.json", LANGUAGES_FILE)


def run_files(checkpoint: Path) -> dict[str, str]:
    """The :data:`RUN_FILES` of the run's final ``RUN/model``, so that an average of the run's checkpoints is the
    same kind of folder as its final model; ``{}`` when the run has not finished."""
    final = checkpoint.parent.parent / RUN_MODEL
    return {name: (final / name).read_text(encoding="utf-8") for name in RUN_FILES if (final / name).is_file()}
