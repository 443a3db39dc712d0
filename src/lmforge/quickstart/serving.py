"""The quickstart's last line: the ``lmforge serve`` command that serves the models it trained.

Every stage's final model folder (``runs/STAGE/model``) that the server can take is named after its stage:
decoders (completions, and chat when instruction-tuned), encoders (embeddings) and fine-tuned task folders
(classification). Encoder-decoders (translation) are left out: the server batches decoders only.

Example:
    >>> serve_command(Path("/nonexistent")) is None
    True
"""

from __future__ import annotations

import shlex
from pathlib import Path

from lmforge.checkpoint import read_config
from lmforge.tasks.model import read_task_meta


def serve_command(root: Path) -> str | None:
    """``lmforge serve --model STAGE=DIR ...`` for the servable models under ``root/runs``, or None."""
    models = []
    for folder in sorted(Path(root).glob("runs/*/model")):
        if not (folder / "config.json").is_file() or not (folder / "tokenizer.json").is_file():
            continue
        servable = read_task_meta(folder) is not None or read_config(folder).arch in ("decoder", "encoder")
        if servable:
            models += ["--model", f"{folder.parent.name}={folder.resolve()}"]
    return shlex.join(["lmforge", "serve", *models]) if models else None
