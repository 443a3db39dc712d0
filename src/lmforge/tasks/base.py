"""What every task shares: the input format of each family, truncation reports, padding, the eval loop.

A :class:`Task` turns rows into encoded examples (``encode``), examples into model batches (``collate``,
the Trainer's batch transform), and model outputs into predictions and metrics (``predict``, ``score``).
Subclasses fill in the task-specific parts; :meth:`Task.evaluate` is the loop they share.

Input formats (single text A, optional pair B)::

    encoder          the tokenizer's template   [CLS] A [SEP] B [SEP]   segments 0/1 (when the model has them)
    decoder          [bos] A [DELIM] B [EXTRACT]  DELIM = sep, else eos;  EXTRACT = eos (GPT, Radford et al. 2018)
                     (input_transform gpt1: three tokens of their own, learned: lmforge.tasks.gpt1_transforms)
    encoder-decoder  the tokenizer's template   <s> A </s></s> B </s>   (BART)  |  A </s> B </s>  (T5)

An input longer than ``max_length`` is cut (the longer side of a pair first) and counted; one warning per
file names how many rows were cut and the first of them.

Example:
    >>> from lmforge.tasks.base import pad_batch
    >>> ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [8, 0, 0]], [[1, 1, 1], [1, 0, 0]])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from lmforge.config import ModelConfig
from lmforge.objectives.base import IGNORE_INDEX
from lmforge.tasks.data import Table, TaskDataError, warn
from lmforge.tasks.gpt1_transforms import check_transform, transform_ids
from lmforge.tasks.spec import TaskSpec

# A --max-length beyond the model's context is worth a warning only when someone chose it.
_DEFAULT_MAX_LENGTH = next(f.default for f in dataclasses.fields(TaskSpec) if f.name == "max_length")


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged id lists -> ``(ids, mask)``, both (B, T) long; ``left=True`` pads on the left (for generation)."""
    T = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), T), dtype=torch.long)
    for i, s in enumerate(sequences):
        if len(s):
            sl = slice(T - len(s), T) if left else slice(0, len(s))
            ids[i, sl] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, sl] = 1
    return ids, mask


def pad_labels(sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """Ragged label lists -> (B, T) long, padded with -100 (ignored by the loss)."""
    return pad_batch(sequences, IGNORE_INDEX)[0]


def report_truncation(table: Table, rows: Sequence[int], limit: int, what: str = "tokens",
                      flag: str = "--max-length", context: int | None = None) -> None:
    """One warning naming the file, how many rows were cut to ``limit`` and the first such row. With
    ``context`` (the model's max_seq_len) reached, raising ``flag`` cannot help, and the advice says so."""
    if rows:
        advice = f"raise {flag} to keep more"
        if context is not None and limit >= context:
            advice = (f"the model reads at most {context} tokens (its max_seq_len), so a larger {flag} cannot keep "
                      "more; shorten the inputs or use a model with a longer context")
        warn(f"{table.name}: {len(rows)} of {len(table)} rows are longer than {limit} {what} and were truncated "
             f"(first: {table.where(rows[0]).split(': ', 1)[1]}); {advice}")


def text_of(table: Table, i: int, column: str) -> str:
    """Row ``i``'s ``column`` as text; an empty or missing value is an error naming the row."""
    value = table.rows[i].get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise TaskDataError(f"{table.where(i)}: column {column!r} is empty")
    return value if isinstance(value, str) else str(value)


class Task:
    """Base class of the task types (see :mod:`lmforge.tasks`).

    Args:
        spec: the TaskSpec (its ``labels`` fixed, for tasks that have classes).
        tokenizer: an :class:`lmforge.tokenization.Tokenizer`.
        config: the body's ModelConfig (family, special token ids, maximum length).
    """

    default_metric = "loss"
    forward_for_predictions = True  # predict() reads the logits of the forward pass over the batch

    def __init__(self, spec: TaskSpec, tokenizer, config: ModelConfig) -> None:
        self.spec, self.tokenizer, self.config = spec, tokenizer, config
        self.columns = spec.columns()
        self.max_length = min(spec.max_length, config.max_seq_len)
        if spec.max_length > config.max_seq_len and spec.max_length != _DEFAULT_MAX_LENGTH:
            warn(f"--max-length {spec.max_length} is more than the model reads: inputs are cut to its context of "
                 f"{config.max_seq_len} tokens (max_seq_len); to keep more, use a model with a longer context")
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else tokenizer.pad_id
        check_transform(spec.input_transform, spec.task, config.arch,
                        spec.task == "multiple-choice" or self.columns.get("text_pair") is not None)

    # ------------------------------------------------------------------ hooks for subclasses
    def label_set(self, table: Table) -> list[str]:
        """Class names found in training rows (tasks with classes override)."""
        return []

    def encode(self, table: Table, labelled: bool = True) -> list[dict[str, Any]]:
        """Rows -> examples (dicts of id lists, ``row`` = row index, ``gold`` when labelled)."""
        raise TypeError(f"{type(self).__name__} does not define encode()")

    def collate(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Examples -> model inputs (B, T) and ``labels`` when the examples have them."""
        raise TypeError(f"{type(self).__name__} does not define collate()")

    def predict(self, model, examples: list[dict[str, Any]], batch: dict[str, torch.Tensor],
                out) -> list[dict[str, Any]]:
        """Predictions (JSON-able dicts) for one batch: its examples, collated inputs and model output."""
        raise TypeError(f"{type(self).__name__} does not define predict()")

    def score(self, examples: list[dict[str, Any]], predictions: list[dict[str, Any]]) -> dict[str, float]:
        """Metrics of predictions against the examples' gold answers."""
        raise TypeError(f"{type(self).__name__} does not define score()")

    # ------------------------------------------------------------------ shared input building
    def check_columns(self, table: Table, labelled: bool) -> None:
        cols = self.columns
        table.require(cols.get("text"), cols.get("text_pair"))
        if labelled:
            table.require(cols.get("label"), cols.get("target"))

    def _specials(self) -> tuple[int | None, int | None, int | None]:
        """(start, delimiter, extract) ids of the decoder format."""
        if self.spec.input_transform != "plain":
            return transform_ids(self.tokenizer)
        cfg, roles = self.config, self.tokenizer.special_token_ids()
        eos = cfg.eos_token_id if cfg.eos_token_id is not None else roles.get("eos_token_id")
        bos = cfg.bos_token_id if cfg.bos_token_id is not None else roles.get("bos_token_id")
        sep = cfg.sep_token_id if cfg.sep_token_id is not None else roles.get("sep_token_id")
        extract = eos if eos is not None else cfg.cls_token_id
        return bos, sep if sep is not None else eos, extract

    def encode_texts(self, table: Table, texts: list[str], pairs: list[str] | None = None,
                     limit: int | None = None) -> tuple[list[list[int]], list[list[int]] | None]:
        """Token ids (and segment ids, for encoders with segments) in the family's format, cut to ``limit``."""
        limit = limit or self.max_length
        tok, cfg = self.tokenizer, self.config
        if cfg.arch == "decoder":
            return self._encode_decoder(table, texts, pairs, limit), None
        enc = tok.encode_batch(texts, pairs)
        long_rows = [i for i, ids in enumerate(enc["input_ids"]) if len(ids) > limit]
        if long_rows:
            cut = tok.encode_batch([texts[i] for i in long_rows], [pairs[i] for i in long_rows] if pairs else None,
                                   truncation=True, max_length=limit)
            for j, i in enumerate(long_rows):
                enc["input_ids"][i] = cut["input_ids"][j]
                if pairs is not None:
                    enc["token_type_ids"][i] = cut["token_type_ids"][j]
            report_truncation(table, long_rows, limit, context=cfg.max_seq_len)
        types = enc.get("token_type_ids") if pairs is not None and cfg.type_vocab_size >= 2 else None
        return enc["input_ids"], types

    def _encode_decoder(self, table: Table, texts, pairs, limit: int) -> list[list[int]]:
        bos, delim, extract = self._specials()
        a = self.tokenizer.encode_batch(texts, add_special_tokens=False)["input_ids"]
        b = self.tokenizer.encode_batch(pairs, add_special_tokens=False)["input_ids"] if pairs else [None] * len(a)
        out, long_rows = [], []
        for i, (x, y) in enumerate(zip(a, b)):
            specials = [t for t in (bos, extract) if t is not None]
            if y is not None and delim is not None:
                specials.append(delim)
            room = limit - len(specials)
            if len(x) + len(y or []) > room:
                long_rows.append(i)
                x, y = _cut_longest_first(x, y, room)
            ids = ([bos] if bos is not None else []) + x
            if y is not None:
                ids += ([delim] if delim is not None else []) + y
            out.append(ids + ([extract] if extract is not None else []))
        report_truncation(table, long_rows, limit, context=self.config.max_seq_len)
        return out

    def collate_inputs(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if isinstance(examples[0]["input_ids"][0], list):  # K sequences per example: (B, K, T)
            B, K = len(examples), len(examples[0]["input_ids"])
            ids, mask = pad_batch([s for e in examples for s in e["input_ids"]], self.pad_id)  # (B*K, T)
            return {"input_ids": ids.view(B, K, -1), "attention_mask": mask.view(B, K, -1)}
        ids, mask = pad_batch([e["input_ids"] for e in examples], self.pad_id)
        batch = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in examples[0]:
            batch["token_type_ids"] = pad_batch([e["token_type_ids"] for e in examples], 0)[0]
        return batch

    # ------------------------------------------------------------------ the evaluation loop
    @torch.no_grad()
    def evaluate(self, model, examples: list[dict[str, Any]], batch_size: int = 32, labelled: bool = True,
                 device: str | torch.device = "cpu") -> tuple[list[dict[str, Any]], dict[str, float]]:
        """Predict every example; with gold answers also return the metrics and the mean loss.

        Returns:
            ``(predictions, metrics)``; metrics has ``loss`` (per target, as in training) and the task's own.
        """
        was_training = model.training
        model.eval()
        predictions: list[dict[str, Any] | None] = [None] * len(examples)
        loss_sum, targets = 0.0, 0
        # Batches of similar lengths pad less; predictions go back to the examples' order.
        order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
        try:
            for start in range(0, len(examples), batch_size):
                members = order[start:start + batch_size]
                chunk = [examples[i] for i in members]
                batch = {k: v.to(device) for k, v in self.collate(chunk).items()}
                out = None
                if labelled or self.forward_for_predictions:
                    out = model(**batch)  # with labels when the examples have them: the loss comes along
                if out is not None and out.loss is not None and out.n_targets:
                    loss_sum += float(out.loss) * out.n_targets
                    targets += out.n_targets
                for i, pred in zip(members, self.predict(model, chunk, batch, out)):
                    predictions[i] = pred
        finally:
            model.train(was_training)
        if not labelled:
            return predictions, {}
        metrics = self.score(examples, predictions)
        if targets:
            metrics = {"loss": loss_sum / targets, **metrics}
        return predictions, metrics


def _cut_longest_first(x: list[int], y: list[int] | None, room: int) -> tuple[list[int], list[int] | None]:
    """Drop tokens from the end of the longer of ``x``/``y`` until both fit in ``room`` (HF's longest_first)."""
    x, y = list(x), (list(y) if y is not None else None)
    while len(x) + len(y or []) > max(room, 0):
        if y is not None and len(y) > len(x):
            y.pop()
        elif x:
            x.pop()
        else:
            y.pop()
    return x, y


def softmax_rows(logits: torch.Tensor) -> list[list[float]]:
    """(B, C) logits -> probabilities as nested lists (rounded to 6 places, for readable JSON)."""
    return [[round(p, 6) for p in row] for row in torch.softmax(logits.float(), -1).tolist()]
