"""The models a server holds, each loaded from its folder and given a kind by what the folder holds:

    task.json (a fine-tuned task model)       classify    POST /v1/classify, as ``lmforge predict`` gives
    a decoder with an LM head                 generate    POST /v1/completions, /v1/chat/completions
    an encoder (BERT-like, sentence encoder)  embed       POST /v1/embeddings, as ``lmforge embed`` gives
    an index folder (``lmforge index build``)  search      POST /v1/search, as ``lmforge index search`` gives

A generating model gets its own :class:`~lmforge.serve.batching.scheduler.Scheduler`; chat renders the
folder's ``chat_template.json`` (written by instruction tuning), so prompts are rendered exactly as in
training. A decoder without one (a base model, e.g. fresh from ``lmforge pretrain``) chats through
:data:`DEFAULT_CHAT_TEMPLATE`, plain ``User:``/``Assistant:`` lines, and says so (``chat_template_default``).

Example:
    >>> parse_model_args(["runs/gpt", "enc=runs/minilm"])
    [('gpt', 'runs/gpt'), ('enc', 'runs/minilm')]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmforge
from lmforge.embeddings.encoder import SentenceEncoder
from lmforge.embeddings.index import META, VectorIndex
from lmforge.errors import UserInputError
from lmforge.generation.compiled import check_supported
from lmforge.generation.slots import check_slot_model, decoding_forms
from lmforge.prompting.instruct import CHAT_TEMPLATE_FILE, ChatTemplate
from lmforge.serve.batching.scheduler import Scheduler
from lmforge.serve.limits import Limits
from lmforge.tasks import inference
from lmforge.tasks.model import read_task_meta
from lmforge.tokenization import Tokenizer
from lmforge.utils.folder_kinds import MODELS, require_kind

# Plain text a base model has seen in its pre-training data (dialogue, transcripts), so its continuation after
# "Assistant:" is its best guess at an answer. No EOS closes a turn: to a base model it separates documents,
# and the user's header (a stop string) ends an answer instead. The header ends without a space because BPE
# vocabularies attach the space to the next word (" Paris").
DEFAULT_CHAT_TEMPLATE = ChatTemplate(system="System: {content}\n", user="User: {content}\n",
                                     assistant="Assistant:{content}\n")


def parse_model_args(values: list[str]) -> list[tuple[str, str]]:
    """``--model DIR`` or ``--model NAME=DIR`` values -> (name, folder); a bare folder is named after itself."""
    out, seen = [], set()
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep:
            name, folder = Path(value.rstrip("/")).name or value, value
        if not name or not folder:
            raise UserInputError(f"--model {value!r}: give DIR or NAME=DIR")
        if name in seen:
            raise UserInputError(f"--model {value!r}: the name {name!r} is given twice; name them with NAME=DIR")
        seen.add(name)
        out.append((name, folder))
    return out


@dataclass
class ServedModel:
    """One model of the server. ``kind``: generate, embed or classify (see the module docstring)."""

    name: str
    kind: str
    folder: Path
    tokenizer: Any
    model: Any = None
    max_len: int = 0
    scheduler: Scheduler | None = None
    chat_template: ChatTemplate | None = None
    encoder: SentenceEncoder | None = None
    task: Any = None
    index: VectorIndex | None = None
    eos_ids: list[int] = field(default_factory=list)
    chat_template_default: bool = False  # no chat_template.json: not instruction-tuned, the plain default is used

    def chat_prompt(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Prompt ids of a conversation, ending with the assistant's header (the model's chat template)."""
        if self.chat_template is None:
            raise UserInputError(f"model {self.name!r} has no chat template ({CHAT_TEMPLATE_FILE}, written by "
                                 "instruction tuning): use completions instead of chat")
        return self.chat_template.encode(self.tokenizer, messages, add_generation_prompt=add_generation_prompt)[0]

    def chat_jinja(self) -> str | None:
        """The chat template as Jinja (what HF tokenizers and lm-evaluation-harness render), or None."""
        return None if self.chat_template is None else self.chat_template.to_jinja(self.tokenizer)

    def chat_stops(self) -> list[str]:
        """Stop strings every chat answer gets: the user's header, where the model would speak for the user."""
        header = self.chat_template.user.split("{content}", 1)[0] if self.chat_template is not None else ""
        return [header] if header.strip() else []

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()


def load_served(name: str, folder: str | Path, limits: Limits, device: str = "cpu", observe=None,
                compile: bool = False) -> ServedModel:
    """Load ``folder`` as the model called ``name`` (the scheduler of a generating model is started; with
    ``compile``, its decode steps are compiled first)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"--model {folder}: not a model folder")
    require_kind(folder, (*MODELS, "index"), flag="--model")  # a biLM, a run folder, ...: one line, nothing loaded
    if (folder / META).is_file():
        return load_index(name, folder, device)
    if not (folder / "tokenizer.json").is_file():
        raise UserInputError(f"--model {folder}: no tokenizer.json (save the model with its tokenizer)")
    if read_task_meta(folder) is not None:
        model, task, _ = inference.load(folder, device=device)
        return ServedModel(name, "classify", folder, task.tokenizer, model=model, task=task)
    model = lmforge.load(folder, device=device).eval()
    tokenizer = Tokenizer.load(folder)
    mc = model.config
    if mc.arch == "encoder":
        encoder = SentenceEncoder.load(folder, device=device)
        return ServedModel(name, "embed", folder, tokenizer, model=encoder.model, encoder=encoder)
    check_slot_model(model)
    if compile:
        check_supported(model)
    max_len = limits.max_len or mc.max_seq_len
    if mc.position in ("learned", "sinusoidal") and max_len > mc.max_seq_len:
        raise UserInputError(f"--max-len {max_len} exceeds model {name!r}'s max_seq_len={mc.max_seq_len} "
                             f"({mc.position} positions)")
    own = (folder / CHAT_TEMPLATE_FILE).is_file()
    template = ChatTemplate.load(folder) if own else DEFAULT_CHAT_TEMPLATE
    eos = mc.eos_token_id
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    scheduler = Scheduler(model, limits.max_batch, limits.max_queue, max_len, observe=observe,
                          decode_weights=decoding_forms(model), compile=compile).start()
    return ServedModel(name, "generate", folder, tokenizer, model=model, max_len=max_len, scheduler=scheduler,
                       chat_template=template, eos_ids=eos_ids, chat_template_default=not own)


def load_index(name: str, folder: Path, device: str = "cpu") -> ServedModel:
    """An index folder with the sentence encoder it was built with (named in its index.json; an encoder folder
    rewritten since, with other weights, is refused)."""
    from lmforge.prompting.rag import open_retriever

    retriever = open_retriever(folder, device=device, flag="--model")
    encoder, index = retriever.encoder, retriever.index
    return ServedModel(name, "search", folder, encoder.tokenizer, model=encoder.model, encoder=encoder, index=index)


def search(m: ServedModel, query: str, k: int) -> list[dict]:
    """The ``k`` documents of ``m``'s index nearest to ``query`` (cosine), best first."""
    vector = m.encoder.encode([query], pooling=m.index.meta.get("pooling"), layer=m.index.meta.get("layer", -1))
    if vector.shape[1] != m.index.vectors.shape[1]:
        raise UserInputError(f"index {m.name!r}: its model gives {vector.shape[1]}-d vectors but the index holds "
                             f"{m.index.vectors.shape[1]}-d ones: rebuild the index with its model")
    return [{"rank": r, "id": i, "score": round(score, 6), "text": text}
            for r, (i, text, score) in enumerate(m.index.search(vector, k)[0], 1)]
