"""Sequence-to-sequence tasks (translation, summarisation): teacher-forced training, greedy decoding.

Formats, with a source S (``task_prefix`` + the text) and a target Y::

    encoder-decoder  encoder: S in the tokenizer's template      decoder labels: Y </s>     (T5, BART)
    decoder          [bos] S [DELIM] Y </s>, loss on Y </s> only                          (GPT-2 style)

Prediction is greedy decoding with the KV cache until ``</s>`` or ``max_target_length`` new tokens (decoder
prompts are left-padded, with position ids that skip the padding). Each prediction carries its sequence
probability (the product of the chosen tokens' probabilities). Metrics: sacrebleu BLEU and chrF,
rouge-score ROUGE-1/2/L, and the teacher-forced loss with its perplexity.

Example:
    >>> import torch, lmforge
    >>> body = lmforge.build_model("t5-tiny", n_layers=1, n_decoder_layers=1, d_model=32, n_heads=2, head_dim=16,
    ...                            d_ff=64, vocab_size=50, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    >>> ids, logprob = greedy_generate(body, torch.randint(2, 50, (3, 6)), torch.ones(3, 6, dtype=torch.long),
    ...                                max_new_tokens=4, eos_id=1, pad_id=0)
    >>> ids.shape[0], ids.shape[1] <= 4, logprob.shape
    (3, True, torch.Size([3]))
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lmforge.nn.kv_cache import KVCache
from lmforge.objectives.base import IGNORE_INDEX, shift_right
import lmforge.tasks.metrics as metrics
from lmforge.tasks.base import Task, pad_batch, pad_labels, report_truncation, text_of
from lmforge.tasks.data import Table
from lmforge.errors import UserInputError


@torch.no_grad()
def greedy_generate(body, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                    eos_id: int | None, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy continuation with the KV cache.

    Args:
        body: an lmforge Transformer with an LM head (decoder or encoder-decoder).
        input_ids, attention_mask: (B, S) sources (encoder-decoder, any padding) or prompts (decoder, left-padded).
        max_new_tokens: at most this many tokens per sequence.
        eos_id: stop a sequence once it produced this id (kept in the output); None = never stop early.

    Returns:
        ``(ids, logprob)``: (B, n) chosen ids (``pad_id`` after a sequence ended) and (B,) the sum of the
        chosen tokens' log-probabilities.
    """
    cfg = body.config
    B = input_ids.shape[0]
    cache = KVCache()
    if cfg.arch == "encoder-decoder":
        memory, _ = body.encode(input_ids, attention_mask)  # once: every step cross-attends to it
        start = cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else pad_id
        enc = {"attention_mask": attention_mask, "encoder_hidden_states": memory}
        out = body(decoder_input_ids=torch.full((B, 1), start, device=input_ids.device), past_key_values=cache,
                   use_cache=True, **enc)
    else:
        mask = attention_mask
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding does not shift the real positions
        out = body(input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        next_pos = positions[:, -1:] + 1
        max_new_tokens = min(max_new_tokens, cfg.max_seq_len - input_ids.shape[1])
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    logprob = torch.zeros(B, device=input_ids.device)
    chosen = []
    for _ in range(max(max_new_tokens, 0)):
        logp = torch.log_softmax(out.logits[:, -1].float(), -1)  # (B, V)
        nxt = logp.argmax(-1)  # (B,)
        logprob += torch.where(done, 0.0, logp.gather(1, nxt[:, None]).squeeze(1))
        nxt = nxt.masked_fill(done, pad_id)
        chosen.append(nxt)
        if eos_id is not None:
            done |= nxt == eos_id
        if bool(done.all()):
            break
        if cfg.arch == "encoder-decoder":
            out = body(decoder_input_ids=nxt[:, None], past_key_values=cache, use_cache=True, **enc)
        else:
            mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
            out = body(nxt[:, None], attention_mask=mask, position_ids=next_pos, past_key_values=cache,
                       use_cache=True)
            next_pos = next_pos + 1
    ids = torch.stack(chosen, 1) if chosen else input_ids.new_zeros(B, 0)
    return ids, logprob


class Seq2SeqTask(Task):
    """Text in, text out (see the module docstring)."""

    default_metric = "bleu"
    forward_for_predictions = False  # predictions come from generate(), not from the training forward

    def __init__(self, spec, tokenizer, config) -> None:
        super().__init__(spec, tokenizer, config)
        self.eos_id = config.eos_token_id if config.eos_token_id is not None else tokenizer.boundary_id
        self.target_limit = spec.max_target_length

    # ------------------------------------------------------------------ encoding
    def sources(self, table: Table) -> list[str]:
        return [self.spec.task_prefix + text_of(table, i, self.columns["text"]) for i in range(len(table))]

    def targets(self, table: Table) -> list[str]:
        return [text_of(table, i, self.columns["target"]) for i in range(len(table))]

    def encode(self, table: Table, labelled: bool = True) -> list[dict[str, Any]]:
        self.check_columns(table, labelled)
        return self.encode_pairs(table, self.sources(table), self.targets(table) if labelled else None)

    def encode_pairs(self, table: Table, sources: list[str], targets: list[str] | None,
                     extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Examples from source texts and (optionally) target texts; ``extra`` is copied into each example."""
        tok, cfg = self.tokenizer, self.config
        y = None
        if targets is not None:
            y = tok.encode_batch(targets, add_special_tokens=False)["input_ids"]
            room = self.target_limit - (self.eos_id is not None)
            long_rows = [i for i, t in enumerate(y) if len(t) > room]
            y = [t[:room] + ([self.eos_id] if self.eos_id is not None else []) for t in y]
            report_truncation(table, long_rows, self.target_limit, "target tokens", "--max-target-length")
        if cfg.arch == "decoder":
            bos, delim, _ = self._specials()
            x = tok.encode_batch(sources, add_special_tokens=False)["input_ids"]
            room = self.max_length - self.target_limit - (bos is not None) - (delim is not None)
            if room < 1:
                raise UserInputError(f"max_length {self.max_length} leaves no room for the source after "
                                     f"{self.target_limit} target tokens; lower --max-target-length")
            report_truncation(table, [i for i, s in enumerate(x) if len(s) > room], room, "source tokens")
            prompts = [([bos] if bos is not None else []) + s[:room] + ([delim] if delim is not None else [])
                       for s in x]
        else:
            prompts, _ = self.encode_texts(table, sources)
        examples = []
        for i, prompt in enumerate(prompts):
            ex = {"row": i, "input_ids": prompt, **(extra or {})}
            if y is not None:
                ex["target_ids"], ex["gold"] = y[i], targets[i]
            examples.append(ex)
        return examples

    def collate(self, examples):
        labelled = "target_ids" in examples[0]
        if self.config.arch == "decoder":
            if not labelled:
                ids, mask = pad_batch([e["input_ids"] for e in examples], self.pad_id)
                return {"input_ids": ids, "attention_mask": mask}
            # inputs = prompt + Y[:-1]; labels aligned with them: -100 on the prompt but its last position,
            # which predicts Y's first token.
            seqs = [e["input_ids"] + e["target_ids"] for e in examples]
            ids, mask = pad_batch([s[:-1] for s in seqs], self.pad_id)
            labels = pad_labels([[IGNORE_INDEX] * (len(e["input_ids"]) - 1) + e["target_ids"] for e in examples])
            return {"input_ids": ids, "attention_mask": mask, "labels": labels}
        ids, mask = pad_batch([e["input_ids"] for e in examples], self.pad_id)
        batch = {"input_ids": ids, "attention_mask": mask}
        if labelled:
            batch["labels"] = pad_labels([e["target_ids"] for e in examples])
        return batch

    def _start(self) -> int:
        cfg = self.config
        return cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else self.pad_id

    # ------------------------------------------------------------------ prediction
    def generate(self, model, examples) -> tuple[list[str], list[float]]:
        """Greedy outputs (texts) and their sequence log-probabilities."""
        device = next(model.parameters()).device
        left = self.config.arch == "decoder"
        ids, mask = pad_batch([e["input_ids"] for e in examples], self.pad_id, left=left)
        out, logprob = greedy_generate(model.body, ids.to(device), mask.to(device), self.target_limit,
                                       self.eos_id, self.pad_id)
        texts = []
        for row in out.tolist():
            if self.eos_id is not None and self.eos_id in row:
                row = row[:row.index(self.eos_id)]
            texts.append(self.tokenizer.decode(row, skip_special_tokens=True).strip())
        return texts, logprob.tolist()

    def predict(self, model, examples, batch, out):
        texts, logprobs = self.generate(model, examples)
        return [{"output": t, "probability": round(math.exp(lp), 6)} for t, lp in zip(texts, logprobs)]

    def score(self, examples, predictions):
        return metrics.generation([p["output"] for p in predictions], [e["gold"] for e in examples])

    def evaluate(self, model, examples, batch_size=32, labelled=True, device="cpu"):
        predictions, scores = super().evaluate(model, examples, batch_size, labelled, device)
        if "loss" in scores:
            scores["perplexity"] = metrics.perplexity(scores["loss"])
        return predictions, scores


@torch.no_grad()
def target_logprobs(task: Seq2SeqTask, model, examples: list[dict[str, Any]],
                    candidates: list[list[int]]) -> torch.Tensor:
    """(B, C) log-probability of each candidate target (ids, ending in eos) for each example's source.

    Used to turn text-to-text predictions into class probabilities (rank classification).
    """
    rows = []
    for cand in candidates:
        batch = task.collate([{**e, "target_ids": cand} for e in examples])
        batch = {k: v.to(next(model.parameters()).device) for k, v in batch.items()}
        labels = batch.pop("labels")
        if task.config.arch == "encoder-decoder":
            batch["decoder_input_ids"] = shift_right(labels, task._start(), task.pad_id)
        logits = model.body(**batch).logits.float()  # (B, T, V)
        logp = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
        rows.append((logp * (labels != IGNORE_INDEX)).sum(-1))  # (B,)
    return torch.stack(rows, 1)
