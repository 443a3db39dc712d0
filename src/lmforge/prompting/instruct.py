"""Instruction tuning: supervised fine-tuning of a decoder LM on demonstrations, with loss on responses only.

Wei et al. 2022 ("Finetuned Language Models Are Zero-Shot Learners", FLAN) and Ouyang et al. 2022 ("Training
language models to follow instructions with human feedback", the SFT stage) fine-tune on (instruction, response)
pairs. Data is JSONL, one example a line, either form:

    {"instruction": "Translate to French.", "input": "cheese", "output": "fromage"}     (Alpaca style)
    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}     (chat)

or a shipped instruction set by name: ``demo-instructions`` (its train split; ``demo-instructions:dev`` names
the other), Alpaca rows written from the public-domain texts that ship with lmforge
(:mod:`lmforge.datasets.instructions`). An Alpaca row becomes ``[user: instruction + "\\n\\n" + input,
assistant: output]``. A :class:`ChatTemplate` renders messages; it is stored with the model as
``chat_template.json`` so that inference renders prompts exactly as training did. Each piece is tokenised on its
own and the ids are concatenated, so the boundary between prompt and response is exact (and
:meth:`ChatTemplate.encode` gives inference the same ids):

    <|user|>\\nTranslate to French.\\n\\ncheese\\n<|assistant|>\\nfromage<|endoftext|>
    '------------- no loss -----------------------------'  '--- loss ----------'

Labels follow lmforge's convention (aligned with predictions): ``labels[t] = ids[t+1]`` where token t+1 is a
response token, else -100. So the loss covers exactly the response tokens (and the end-of-sequence token that
closes each response, so the model learns to stop).

Packing (``pack=True``) concatenates short examples into rows of ``max_length`` tokens. It uses a block-diagonal
causal attention mask (B, T, T) and positions that restart at 0 in each example, so a packed example sees
nothing of its neighbours: its logits equal those of the example alone (tested). Decoders only.

Example:
    >>> from lmforge.prompting.instruct import ChatTemplate, alpaca_to_messages
    >>> t = ChatTemplate()
    >>> pieces = t.render(alpaca_to_messages({"instruction": "Say hi.", "input": "", "output": "hi"}), eos="</s>")
    >>> [(text, trained) for text, trained in pieces]
    [('<|user|>\\nSay hi.\\n', False), ('<|assistant|>\\n', False), ('hi</s>', True)]
"""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Sequence

import torch

import lmforge
from lmforge import datasets
from lmforge.config import ConfigBase
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.tasks.data import ExampleBatches
from lmforge.tokenization import Tokenizer
from lmforge.training import Trainer
from lmforge.training.config import TrainConfig
from lmforge.utils.io import atomic_write_text

CHAT_TEMPLATE_FILE = "chat_template.json"
ROLES = ("system", "user", "assistant")


@dataclass
class ChatTemplate(ConfigBase):
    """How messages become text. ``{content}`` is the message; in ``assistant``, what precedes ``{content}`` is
    the header (a prompt) and ``{content}`` plus what follows it is the trained response; ``{eos}`` is the
    tokenizer's end-of-sequence token."""

    system: str = "<|system|>\n{content}\n"
    user: str = "<|user|>\n{content}\n"
    assistant: str = "<|assistant|>\n{content}{eos}\n"

    def __post_init__(self) -> None:
        for f in fields(self):
            if "{content}" not in getattr(self, f.name):
                raise UserInputError(f"chat template field {f.name!r} needs a {{content}} placeholder")

    def render(self, messages: Sequence[dict[str, str]], eos: str = "", add_generation_prompt: bool = False
               ) -> list[tuple[str, bool]]:
        """(text, is_response) pieces; ``add_generation_prompt`` ends with the assistant header (inference)."""
        pieces = []
        for m in validate_messages(messages, need_response=not add_generation_prompt):
            fmt = getattr(self, m["role"])
            head, tail = fmt.split("{content}", 1)
            head = head.replace("{eos}", eos)
            if m["role"] == "assistant":
                pieces += [(head, False), (m["content"] + tail.replace("{eos}", eos).rstrip("\n"), True)]
                # the newline after a response is the next turn's start, not something the model must say
                if tail.replace("{eos}", eos).endswith("\n"):
                    pieces.append(("\n", False))
            else:
                pieces.append((head + m["content"] + tail.replace("{eos}", eos), False))
        if add_generation_prompt:
            pieces.append((self.assistant.split("{content}", 1)[0], False))
        while pieces and pieces[-1] == ("\n", False):
            pieces.pop()
        return [p for p in pieces if p[0]]

    def encode(self, tokenizer, messages: Sequence[dict[str, str]], add_generation_prompt: bool = False
               ) -> tuple[list[int], list[bool]]:
        """Token ids and, per token, whether it belongs to a response."""
        ids, response = _bos(tokenizer), []
        response += [False] * len(ids)
        for text, trained in self.render(messages, tokenizer.special_token("eos") or "", add_generation_prompt):
            piece = tokenizer.encode(text, add_special_tokens=False)
            ids += piece
            response += [trained] * len(piece)
        return ids, response

    def to_jinja(self, tokenizer) -> str:
        """This template as a Jinja chat template (HF's ``tokenizer_config.json`` ``chat_template``, over
        ``messages`` and ``add_generation_prompt``): it renders the text of :meth:`render`'s pieces joined, after
        the BOS that :meth:`encode` opens with, so ``tokenizer.apply_chat_template(messages, tokenize=False)``
        in transformers (or lm-evaluation-harness) gives the string lmforge trains and serves on. The tokenizer's
        BOS/EOS strings are written into the template, so it needs no variables beyond those two.

        Example:
            >>> from jinja2 import Environment
            >>> class Tok:
            ...     def special_token(self, role): return {"eos": "</s>"}.get(role)
            >>> jinja = Environment().from_string(ChatTemplate().to_jinja(Tok()))
            >>> jinja.render(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
            '<|user|>\\nhi\\n<|assistant|>\\n'
        """
        eos = tokenizer.special_token("eos") or ""
        bos = tokenizer.special_token("bos")

        def lit(text: str) -> str:
            # A JSON string is a Jinja string literal: Jinja unescapes \n, \" and \\ the same way.
            return json.dumps(text, ensure_ascii=False)

        def parts(role: str) -> tuple[str, str]:
            head, tail = getattr(self, role).split("{content}", 1)
            return head.replace("{eos}", eos), tail.replace("{eos}", eos)

        (sh, st), (uh, ut), (ah, at) = parts("system"), parts("user"), parts("assistant")
        at, newline = at.rstrip("\n"), "\n" if at.endswith("\n") else ""
        gen = self.assistant.split("{content}", 1)[0]  # as render() ends an inference prompt
        return (
            (f"{{{{ {lit(bos)} }}}}" if bos is not None and bos != eos else "")
            + "{%- set gen = add_generation_prompt is defined and add_generation_prompt -%}"
            "{%- for message in messages -%}"
            f"{{%- if message['role'] == 'system' -%}}{{{{ {lit(sh)} + message['content'] + {lit(st)} }}}}"
            f"{{%- elif message['role'] == 'user' -%}}{{{{ {lit(uh)} + message['content'] + {lit(ut)} }}}}"
            f"{{%- elif message['role'] == 'assistant' -%}}{{{{ {lit(ah)} + message['content'] + {lit(at)} }}}}"
            # the newline after a response opens the next turn: a conversation does not end with it
            f"{{%- if {lit(newline)} and not (loop.last and not gen) -%}}{{{{ {lit(newline)} }}}}{{%- endif -%}}"
            "{%- else -%}{{ raise_exception('a message role must be system, user or assistant') }}"
            "{%- endif -%}"
            "{%- endfor -%}"
            f"{{%- if gen -%}}{{{{ {lit(gen)} }}}}{{%- endif -%}}"
        )

    config_noun = "chat template field(s)"

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / CHAT_TEMPLATE_FILE
        atomic_write_text(path, json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, folder: str | Path) -> "ChatTemplate":
        """The template stored in a model folder, or the default one if it has none."""
        path = Path(folder) / CHAT_TEMPLATE_FILE
        if not path.exists():
            return cls()
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")), source=str(path))


def _bos(tokenizer) -> list[int]:
    # Llama-style vocabularies open every sequence with a BOS distinct from EOS; GPT-2's single
    # <|endoftext|> is a separator, not a start marker, so nothing is prepended there.
    bos, eos = tokenizer.special_token("bos"), tokenizer.special_token("eos")
    return [tokenizer.token_to_id(bos)] if bos is not None and bos != eos else []


def validate_messages(messages: Sequence[dict[str, str]], need_response: bool = True) -> list[dict[str, str]]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise UserInputError("'messages' must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise UserInputError(f"each message needs a role in {ROLES} and a string content, got {m!r}")
    if need_response and not any(m["role"] == "assistant" for m in messages):
        raise UserInputError("a training conversation needs at least one assistant message")
    return list(messages)


def alpaca_to_messages(row: dict[str, Any]) -> list[dict[str, str]]:
    """``{"instruction", "input", "output"}`` -> a user turn and an assistant turn."""
    if "instruction" not in row or "output" not in row:
        raise UserInputError(f"an instruction row needs 'instruction' and 'output' (and optional 'input'), "
                             f"got {sorted(row)}")
    prompt = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": row["output"]}]


def read_instruct_jsonl(path: str | Path) -> list[list[dict[str, str]]]:
    """Conversations from a JSONL file of Alpaca rows or ``messages`` rows (see the module docstring)."""
    conversations = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                conversations.append(validate_messages(row["messages"]) if "messages" in row
                                     else alpaca_to_messages(row))
            except (ValueError, KeyError, TypeError) as exc:
                raise UserInputError(f"{path}:{n}: {exc}") from None
    if not conversations:
        raise UserInputError(f"{path}: no examples")
    return conversations


def instruction_sets() -> list[str]:
    """The shipped data sets that are instruction sets (Alpaca columns), e.g. ``demo-instructions``."""
    return [name for name in datasets.names()
            if datasets.info(name).shipped and {"instruction", "output"} <= set(datasets.info(name).columns)]


def read_instructions(source: str | Path) -> list[list[dict[str, str]]]:
    """Conversations from a JSONL file, or from a shipped instruction set: ``NAME`` (its train split) or
    ``NAME:SPLIT``. A source that is neither is one line naming it, with the closest shipped name."""
    if Path(source).is_file():  # a folder of the same name as a shipped set is no data file: the name wins
        return read_instruct_jsonl(source)
    name, _, split = str(source).partition(":")
    shipped = instruction_sets()
    if name in shipped:
        return [alpaca_to_messages(row) for row in datasets.load(name, split or "train")]
    close = difflib.get_close_matches(name, shipped, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"shipped instruction sets: {', '.join(shipped)}"
    raise InputFileNotFound(f"{source}: no such file, nor a shipped instruction set; {hint}")


def default_eval(train: str | Path) -> str | None:
    """``NAME:dev`` when ``train`` names a shipped instruction set that has a dev split, else None: a set by
    name is evaluated on its own dev split, as a task by name is (``lmforge finetune --task rt-sentiment``)."""
    name = str(train)
    if Path(name).is_file() or name not in instruction_sets():
        return None
    return f"{name}:dev" if "dev" in datasets.info(name).files else None


def build_instruct_dataset(conversations: Sequence[Sequence[dict[str, str]]] | str | Path, tokenizer,
                           template: ChatTemplate | None = None, max_length: int = 512) -> list[dict[str, list]]:
    """Encode conversations (or a JSONL path or shipped set name, :func:`read_instructions`):
    ``[{"input_ids": [...], "response_mask": [...]}, ...]``.

    Examples longer than ``max_length`` are cut at the end; one left without a response token is dropped.
    """
    if isinstance(conversations, (str, Path)):
        conversations = read_instructions(conversations)
    template = template or ChatTemplate()
    examples = []
    for messages in conversations:
        ids, response = template.encode(tokenizer, messages)
        ids, response = ids[:max_length], response[:max_length]
        if any(response[1:]):  # a response token after the first position can be predicted
            examples.append({"input_ids": ids, "response_mask": response})
    if not examples:
        raise UserInputError(f"no example keeps a response token within max_length={max_length}")
    return examples


def response_labels(ids: Sequence[int], response: Sequence[bool]) -> list[int]:
    """Aligned labels: position t predicts token t+1, kept only when t+1 is a response token."""
    return [ids[t + 1] if response[t + 1] else -100 for t in range(len(ids) - 1)] + [-100]


class SFTCollator:
    """Objective for the Trainer: a list of :func:`build_instruct_dataset` examples -> a decoder batch.

    Args:
        pad_id: id written in padding (never attended, never a label).
        max_length: row length cap; with ``pack``, the length of every packed row.
        pack: concatenate examples (in order, next-fit) into rows with a block-diagonal causal mask.

    Without packing: ``input_ids``/``labels``/``attention_mask`` (B, T), right-padded. With packing:
    ``input_ids``/``labels``/``position_ids`` (B, T) and ``attention_mask`` (B, T, T) bool. Packing works on the
    examples of one micro-batch (the Trainer's ``batch_size``): a step still sees that many examples, in fewer,
    fuller rows, and the token-normalised loss is unchanged by how they are packed.
    """

    def __init__(self, pad_id: int, max_length: int = 512, pack: bool = False) -> None:
        self.pad_id, self.max_length, self.pack = pad_id, max_length, pack

    def __call__(self, examples: Sequence[dict[str, list]]) -> dict[str, torch.Tensor]:
        items = [(e["input_ids"][: self.max_length], e["response_mask"][: self.max_length]) for e in examples]
        return self._packed(items) if self.pack else self._padded(items)

    def _padded(self, items) -> dict[str, torch.Tensor]:
        T = max(len(ids) for ids, _ in items)
        ids = torch.full((len(items), T), self.pad_id, dtype=torch.long)
        labels = torch.full((len(items), T), -100, dtype=torch.long)
        mask = torch.zeros(len(items), T, dtype=torch.long)
        for b, (x, r) in enumerate(items):
            ids[b, : len(x)] = torch.tensor(x)
            labels[b, : len(x)] = torch.tensor(response_labels(x, r))
            mask[b, : len(x)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def _packed(self, items) -> dict[str, torch.Tensor]:
        rows: list[list[tuple[list[int], list[bool]]]] = [[]]
        for x, r in items:
            if sum(len(s) for s, _ in rows[-1]) + len(x) > self.max_length:
                rows.append([])
            rows[-1].append((x, r))
        rows = [row for row in rows if row]
        T = max(sum(len(s) for s, _ in row) for row in rows)
        B = len(rows)
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        labels = torch.full((B, T), -100, dtype=torch.long)
        positions = torch.zeros(B, T, dtype=torch.long)
        segment = torch.full((B, T), -1, dtype=torch.long)  # which example each position holds; -1 = padding
        for b, row in enumerate(rows):
            start = 0
            for s, (x, r) in enumerate(row):
                end = start + len(x)
                ids[b, start:end] = torch.tensor(x)
                labels[b, start:end] = torch.tensor(response_labels(x, r))
                positions[b, start:end] = torch.arange(len(x))
                segment[b, start:end] = s
                start = end
        causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
        same = segment[:, :, None] == segment[:, None, :]  # (B, T, T): query and key in the same example
        mask = same & causal & (segment[:, :, None] >= 0)
        mask |= torch.eye(T, dtype=torch.bool)  # a padding query sees itself only (its output is unused)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "labels": labels}


def finetune_instruct(model, tokenizer, train: Sequence | str | Path, config, *, out: str | Path,
                      template: ChatTemplate | None = None, max_length: int | None = None, pack: bool = False,
                      eval_data: Sequence | str | Path | None = None):
    """Instruction-tune a decoder with the lmforge Trainer; the final folder gets ``chat_template.json``.

    Args:
        model: a decoder Transformer. tokenizer: its tokenizer.
        train / eval_data: conversations, or JSONL paths (see the module docstring).
        config: a :class:`lmforge.training.config.TrainConfig` (batch_size, max_steps, lr, ...).
        out: the run folder; the fine-tuned model is written to ``out/model``.
        template: the chat template (default: the one stored with the model, else :class:`ChatTemplate`).
        max_length: row length (default: the model's ``max_seq_len``). pack: see :class:`SFTCollator`.

    Returns:
        The Trainer's ``TrainResult``.

    Example:
        >>> # finetune_instruct(model, tok, "alpaca.jsonl", TrainConfig(max_steps=100, batch_size=8), out="runs/sft")
    """
    if model.config.arch != "decoder":
        raise UserInputError(f"instruction tuning here trains decoders; got arch={model.config.arch!r}")
    template = template or ChatTemplate()
    max_length = max_length or model.config.max_seq_len
    examples = build_instruct_dataset(train, tokenizer, template, max_length)
    evals = build_instruct_dataset(eval_data, tokenizer, template, max_length) if eval_data is not None else None
    collator = SFTCollator(tokenizer.pad_id, max_length, pack)
    batches = ExampleBatches(examples, config.batch_size, seed=config.seed)
    eval_batches = ExampleBatches(evals, config.batch_size, shuffle=False) if evals else None
    # The template goes into OUT/model with the weights: one atomic folder, written while the run holds its lock.
    files = {CHAT_TEMPLATE_FILE: json.dumps(asdict(template), indent=2) + "\n"}
    trainer = Trainer(model, collator, batches, config, out=out, eval_data=eval_batches, tokenizer=tokenizer,
                      model_files=files, job="instruct")
    return trainer.fit()


def finetune_instruct_from_settings(settings: dict[str, Any], *, pack: bool = False):
    """Run :func:`finetune_instruct` from ``lmforge finetune``'s settings dict (``--task instruct``).

    Reads ``model`` (folder or preset), ``tokenizer`` (default: the model folder), ``random_init``, ``train``,
    ``eval``, ``out``, ``task.max_length`` and ``trainer`` (TrainConfig fields). ``train`` may name a shipped
    instruction set (``demo-instructions``), whose dev split is then the default ``eval``. A chat template stored
    in the model folder is kept; otherwise the default one is used. Returns the Trainer's ``TrainResult``.
    """
    # The data first: a mistyped --train is reported before a model is loaded.
    eval_source = settings.get("eval") or default_eval(settings["train"])
    train = read_instructions(settings["train"])
    evals = read_instructions(eval_source) if eval_source else None
    source = settings["model"]
    tok_dir = settings.get("tokenizer") or source
    if not (Path(tok_dir) / "tokenizer.json").is_file():
        raise UserInputError(f"{tok_dir}: no tokenizer.json (pass --tokenizer DIR)")
    model = lmforge.load(source).train()
    if settings.get("random_init"):
        model.reset_parameters()
    config = TrainConfig.from_dict({**settings.get("trainer", {}), "model": str(source), "out": str(settings["out"])},
                                   source="instruct settings")
    return finetune_instruct(model, Tokenizer.load(tok_dir), train, config, out=settings["out"],
                             template=ChatTemplate.load(source) if Path(source).is_dir() else None,
                             max_length=(settings.get("task") or {}).get("max_length"), pack=pack,
                             eval_data=evals)
