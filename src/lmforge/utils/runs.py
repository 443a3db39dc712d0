"""Run folders: which model folder inside a run a command means.

A run folder (``lmforge pretrain`` / ``finetune --out RUN``) holds its checkpoints and, at the end, ``RUN/model``
(the last step) and, for a fine-tuning run with evaluation, ``RUN/best`` (the best evaluation). A command that
reads a model accepts the run folder itself and picks ``RUN/best``, else ``RUN/model``.

Example:
    >>> import pathlib, tempfile
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> (run / "model").mkdir(); _ = (run / "model" / "config.json").write_text("{}")
    >>> folder, picked = model_folder(run)
    >>> folder.name, picked
    ('model', True)
    >>> model_folder(run / "model") == (run / "model", False)
    True
"""

from __future__ import annotations

from pathlib import Path

# In the order a command prefers them: the best evaluation, else the last step.
RUN_MODEL_DIRS = ("best", "model")
# Files that make a folder a model folder: a fine-tuned task folder, or a model (lmforge or Hugging Face).
MODEL_FILES = ("task.json", "config.json")


def is_model_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a model (task.json or config.json)."""
    return any((Path(path) / name).is_file() for name in MODEL_FILES)


def model_folder(path: str | Path) -> tuple[Path, bool]:
    """``(folder, picked)``: ``path`` itself when it holds a model (or is no run folder), else the run's
    ``best/`` or, failing that, its ``model/``; ``picked`` says that a subfolder was chosen."""
    path = Path(path)
    if not path.is_dir() or is_model_folder(path):
        return path, False
    for name in RUN_MODEL_DIRS:
        if is_model_folder(path / name):
            return path / name, True
    return path, False
