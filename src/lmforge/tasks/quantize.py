"""Quantise a model folder for inference, and state what it cost: perplexity and greedy agreement vs fp32.

:func:`quantize_folder` loads a full-precision decoder folder, converts its linear layers to weight-only int8
or int4 (:mod:`lmforge.models.quantize`), saves the result as a model folder that loads without
re-quantising, and measures both models on the same held-out text and prompts:

    perplexity   exp(mean NLL) of next-token prediction over a held-out slice of the bundled Austen corpus
                 (its last characters, in windows of the model's context), fp32 model vs quantised
    change       ppl_q / ppl_fp32 - 1
    agreement    greedy decoding of a fixed prompt set with both models: the common prefix of the two
                 continuations, as a fraction of the new tokens (1.0: identical outputs)

Quantisation error is a rounding of every weight: int8 per row keeps each weight within half a step of
1/127 of its row's largest weight (on an x86 CPU the activations are rounded to 7 or 8 bits per call too, and that
is measured here as well), so logits and perplexity barely move (the tests bound the change at 1%);
int4 with groups of 32 has 16 levels per group, much coarser, and the tests bound its change at 2% on a
small trained GPT (see tests/test_quantize.py for why). A tied LM head's table is quantised with the layers
(its rows then also feed the input); position tables and norms stay in full precision.

Example:
    >>> windows(list(range(10)), 4)                 # every id after the first is predicted once
    [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    >>> len(held_out_text(500))
    500
"""

from __future__ import annotations

import gzip
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from lmforge import checkpoint, datasets
from lmforge.errors import UserInputError
from lmforge.generation import encode_prompt, generate
from lmforge.model_folder import is_model_folder
from lmforge.models.quantize import quantize_model, save_quantized
from lmforge.tokenization import Tokenizer
from lmforge.utils.io import refuse_foreign_folder

PROMPTS = ("It is a truth universally acknowledged", "She was", "The weather", "My dear", "In the morning",
           "He said that")
HELD_OUT_CHARS = 6000


@dataclass
class QualityReport:
    """What a quantisation cost, measured against the fp32 model on the same text and prompts."""

    mode: str
    ppl_fp32: float
    ppl_quantized: float
    agreement: float
    tokens: int
    kept: dict[str, str]

    @property
    def ppl_change(self) -> float:
        return self.ppl_quantized / self.ppl_fp32 - 1

    def lines(self) -> list[str]:
        return [f"quantisation  {self.mode}",
                f"perplexity    fp32 {self.ppl_fp32:.4f}  {self.mode} {self.ppl_quantized:.4f}  "
                f"change {100 * self.ppl_change:+.3f}%  ({self.tokens} held-out tokens of the bundled corpus)",
                f"greedy        {100 * self.agreement:.1f}% of new tokens agree with fp32 (common prefix, "
                f"{len(PROMPTS)} prompts)"]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ppl_change": self.ppl_change}


def held_out_text(chars: int = HELD_OUT_CHARS) -> str:
    """The last ``chars`` characters of the bundled Austen corpus (``lmforge datasets path corpus``)."""
    with gzip.open(datasets.path("corpus"), "rt", encoding="utf-8") as f:
        return f.read()[-chars:]


def windows(ids: Sequence[int], length: int) -> list[list[int]]:
    """Windows of ``length`` ids overlapping by one, so every id after the first is predicted exactly once."""
    step = max(length - 1, 1)
    return [list(ids[i:i + length]) for i in range(0, max(len(ids) - 1, 1), step) if len(ids[i:i + length]) > 1]


@torch.inference_mode()
def perplexity(model, ids: Sequence[int], length: int) -> tuple[float, int]:
    """(exp of the mean next-token NLL over ``ids``, tokens predicted), in windows of ``length``."""
    total, count = 0.0, 0
    for window in windows(ids, length):
        x = torch.tensor([window])  # (1, T)
        logits = model(x).logits.float()  # (1, T, V)
        nll = torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:], reduction="sum")
        total, count = total + float(nll), count + x.shape[1] - 1
    return math.exp(total / count), count


def greedy_agreement(reference, model, tokenizer: Tokenizer, prompts: Sequence[str] = PROMPTS,
                     new_tokens: int = 16) -> float:
    """Fraction of greedy new tokens in the common prefix of ``model``'s and ``reference``'s continuations."""
    agree = total = 0
    # A short-context model still gets a check: the prompt keeps its last tokens and the continuation shrinks, so
    # prompt and continuation fit the context (a 32-token model with a 20-token prompt failed here).
    context = reference.config.max_seq_len
    new_tokens = max(1, min(new_tokens, context // 2))
    for prompt in prompts:
        ids = encode_prompt(reference, tokenizer, prompt)[-(context - new_tokens):]
        a, b = (generate(m, ids, max_new_tokens=new_tokens, ignore_eos=True).tolist()[0] for m in (reference, model))
        prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        agree, total = agree + prefix, total + max(len(a), len(b))
    return agree / max(total, 1)


def measure(reference, quantized, tokenizer: Tokenizer, mode: str, kept: dict[str, str] | None = None,
            text: str | None = None) -> QualityReport:
    """Perplexity of both models on ``text`` (default: :func:`held_out_text`) and their greedy agreement."""
    ids = tokenizer.encode(text if text is not None else held_out_text())
    length = min(reference.config.max_seq_len, 256)
    ppl_ref, n = perplexity(reference, ids, length)
    ppl_q, _ = perplexity(quantized, ids, length)
    return QualityReport(mode, ppl_ref, ppl_q, greedy_agreement(reference, quantized, tokenizer), n, kept or {})


def quantize_folder(model_dir: str | Path, to: str, out: str | Path, group_size: int = 32) -> QualityReport:
    """Quantise the decoder in ``model_dir`` to ``to`` (int8 | int4), save it to ``out``, and report its quality."""
    model_dir = Path(model_dir)
    if checkpoint.is_bilm(model_dir) or not model_dir.is_dir():
        raise UserInputError(f"--model {model_dir}: not an lmforge or Hugging Face model folder")
    if not (model_dir / checkpoint.TOKENIZER_FILE).is_file() and not checkpoint.is_hf_folder(model_dir):
        raise UserInputError(f"--model {model_dir}: no {checkpoint.TOKENIZER_FILE}; the quality report needs it")
    if Path(out).resolve() == model_dir.resolve():
        raise UserInputError(f"--out {out}: is the --model folder; write the quantised model to a new folder")
    # Before minutes of work: a user's folder or a run folder at --out is never replaced by a model folder.
    refuse_foreign_folder(out, is_model_folder, "a model folder", "--out")
    reference, tokenizer = checkpoint.read_model_folder(model_dir)
    if getattr(reference.config, "arch", None) != "decoder" or reference.lm_head is None:
        raise UserInputError(f"--model {model_dir}: a decoder with an LM head is needed (perplexity and greedy "
                             "decoding are its quality measures)")
    if getattr(reference, "_lmforge_quantization", None) is not None:
        raise UserInputError(f"--model {model_dir}: already quantised; quantise the full-precision folder")
    quantized, _ = checkpoint.read_model_folder(model_dir, with_tokenizer=False)
    record = quantize_model(quantized, to, group_size)
    # Measured before saving: a report that cannot be made leaves no --out folder behind.
    report = measure(reference.eval(), quantized.eval(), tokenizer, to, record["kept"])
    save_quantized(quantized, out, tokenizer=tokenizer)
    return report
