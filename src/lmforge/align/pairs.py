"""Preference pairs from a policy and a reward model (``lmforge align make-pairs``), as in the RLHF data loop
of Stiennon et al. 2020 with the labeller replaced by a reward model (RLAIF-style, or Ziegler et al.'s
sentiment task): sample k continuations of each prompt, score them, keep the best as ``chosen`` and the worst
as ``rejected``::

    for each prompt x:   y_1..y_k ~ pi(. | x)   (batched, KV-cached sampling)
                         s_i = reward(x, y_i)
                         chosen = y_argmax s, rejected = y_argmin s   over the non-blank y_i (skipped when the
                                                                      scores or texts tie)

The file is JSONL (``prompt``, ``chosen``, ``rejected``, ``chosen_score``, ``rejected_score``), the input of
``lmforge align --method dpo --train`` and of ``lmforge finetune --task reward``. It is written atomically:
a refused or interrupted run leaves no partial file.

Example:
    >>> best_and_worst(["a", "b", "c"], [0.1, 0.9, 0.5])
    (1, 0)
    >>> best_and_worst(["a", "a"], [0.3, 0.7]) is None       # the same text twice: no preference
    True
    >>> best_and_worst(["a", "", "c"], [0.1, 0.9, 0.5])      # an empty continuation is never kept
    (2, 0)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

from lmforge.align.data import check_prompt_length
from lmforge.align.logprobs import PromptEncoder
from lmforge.errors import UserInputError
from lmforge.generation.generate import generate
from lmforge.utils.io import atomic_write_text


def best_and_worst(texts: Sequence[str], scores: Sequence[float]) -> tuple[int, int] | None:
    """Indices of the highest- and lowest-scoring non-blank texts, or None when no two of them differ in both
    text and score. A blank continuation (the policy ended at once) is no response: a pairs file refuses it."""
    kept = [i for i in range(len(texts)) if texts[i].strip()]
    if len(kept) < 2:
        return None
    hi = max(kept, key=lambda i: scores[i])
    lo = min(kept, key=lambda i: scores[i])
    if scores[hi] == scores[lo] or texts[hi] == texts[lo]:
        return None
    return hi, lo


@torch.no_grad()
def make_pairs(model, encoder: PromptEncoder, prompts: Sequence[dict], reward, out: str | Path, k: int = 4,
               max_new_tokens: int = 24, temperature: float = 1.0, top_k: int | None = None, seed: int = 0,
               batch_size: int = 16) -> dict[str, int]:
    """Write the pairs file ``out`` (see the module docstring); returns ``{"pairs", "skipped"}``.

    Args:
        model: the policy (a decoder LM); encoder: its :class:`~lmforge.align.logprobs.PromptEncoder`.
        prompts: prompt records (``{"prompt", "where", ...}``); reward: ``reward(prompts, responses, rows)``.
        k: continuations sampled per prompt (>= 2).
        seed: sampling seed; batch ``b`` samples with ``seed + b``, so a file is reproducible.
    """
    if k < 2:
        raise UserInputError(f"--k {k}: a pair needs at least 2 samples per prompt")
    out = Path(out)
    if not out.parent.is_dir():
        raise UserInputError(f"--out {out}: the folder {out.parent} does not exist")
    ids = [encoder.prompt(p["prompt"]) for p in prompts]
    for row, x in zip(prompts, ids):
        check_prompt_length(x, row["where"], encoder.max_len, room=max_new_tokens)
    lines, skipped = [], 0
    for b, start in enumerate(range(0, len(prompts), batch_size)):
        rows = prompts[start:start + batch_size]
        gen = generate(model, ids[start:start + batch_size], strategy="sample", num_return_sequences=k,
                       max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed + b)
        responses = [seq[:int(n)] for seq, n in zip(gen.sequences.tolist(), gen.lengths.tolist())]
        texts = encoder.tokenizer.decode_batch(responses)
        owners = [rows[i // k] for i in range(len(texts))]
        scores = [float(s) for s in reward([r["prompt"] for r in owners], texts, owners)]
        for i, row in enumerate(rows):
            group, group_scores = texts[i * k:(i + 1) * k], scores[i * k:(i + 1) * k]
            picked = best_and_worst(group, group_scores)
            if picked is None:
                skipped += 1
                continue
            hi, lo = picked
            lines.append(json.dumps({"prompt": row["prompt"], "chosen": group[hi], "rejected": group[lo],
                                     "chosen_score": group_scores[hi], "rejected_score": group_scores[lo]}))
    if not lines:
        raise UserInputError(f"no pairs: every prompt's {k} samples tied in text or score; raise --k or "
                             "--temperature")
    atomic_write_text(out, "\n".join(lines) + "\n")
    return {"pairs": len(lines), "skipped": skipped}
