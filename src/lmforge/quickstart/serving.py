"""The quickstart's last line: the ``lmforge serve`` command that serves the models it trained.

Every stage's final model folder (``runs/STAGE/model``) that the server can take is named after its stage:
decoders (completions, and chat when instruction-tuned), encoders (embeddings) and fine-tuned task folders
(classification). Encoder-decoders (translation) are left out: the server batches decoders only.

:func:`chat_commands` gives the report's chat section its commands: serve or chat with the pre-trained decoder
(not instruction-tuned, so through the default template), and instruction-tune it on the shipped
``demo-instructions`` first.

Example:
    >>> serve_command(Path("/nonexistent")) is None
    True
    >>> chat_commands("runs/pretrain-gpt/model", Path("/q"))["chat"]
    'lmforge chat --model /q/runs/pretrain-gpt/model'
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


SERVE_PORT = 8000  # lmforge serve's default --port
PLACEHOLDER = "QS"  # names the run folder in commands written without its path


def chat_commands(model_dir: str, root: Path | None = None) -> dict[str, str]:
    """The commands that serve, chat with and instruction-tune the decoder in ``model_dir`` (relative to the run
    folder ``root``; None: ``QS`` stands for it): ``serve``, ``playground`` (its URL), ``chat``, ``finetune`` (on
    ``demo-instructions``, into ``ROOT-instruct`` beside the run folder: a run inside it would join the
    quickstart's price tags when the report is rebuilt) and ``chat_tuned`` (with the tuned model)."""
    base = Path(root) if root is not None else Path(PLACEHOLDER)
    model, tuned = str(base / model_dir), f"{base}-instruct"
    return {
        "serve": shlex.join(["lmforge", "serve", "--model", model]),
        "playground": f"http://127.0.0.1:{SERVE_PORT}/",
        "chat": shlex.join(["lmforge", "chat", "--model", model]),
        "finetune": shlex.join(["lmforge", "finetune", "--task", "instruct", "--model", model, "--train",
                                "demo-instructions", "--out", tuned]),
        "chat_tuned": shlex.join(["lmforge", "chat", "--model", f"{tuned}/model"]),
    }
