"""An lm-evaluation-harness model (``lm_eval --model lmforge``) over an lmforge decoder folder.

lm_eval asks a model three things; each runs on lmforge's own forward pass and generation:

    loglikelihood          (context, continuation) -> (log p(continuation | context), is it the greedy choice)
    loglikelihood_rolling  text -> log p(text), scored in windows of the context (perplexity tasks)
    generate_until         (context, {until, max_gen_toks, ...}) -> the text generated up to a stop string

Scoring batches requests of similar length, left-padded, with positions counted over the real tokens (so a
learned position table sees what an unpadded run sees), and computes the vocabulary projection only for the
positions it scores (``logits_to_keep``). A text longer than the context is cut into lm_eval's rolling windows
(:func:`lm_eval.utils.get_rolling_token_windows`, as its ``hf`` backend does): every token is predicted once,
the first from the prefix token (BOS, else EOS), each later window with as much preceding text as fits.
Generation is :func:`lmforge.generation.generate` (greedy unless the task asks to sample, KV-cached), batched
per distinct set of generation settings.

Tokens are those of the folder's tokenizer, as lm_eval's ``hf`` backend reads the ``lmforge convert to-hf``
export of the same folder: no template, a BOS only for families with their own (Llama style, not GPT's).

lm_eval is the ``harness`` extra (``pip install 'lmforge[harness]'``); without it this module still imports,
and :func:`register` says what to install.

Example (``lm_eval`` installed; the model is untrained, so the numbers are noise)::

    from lmforge.evaluation.harness_lm import LmforgeLM
    lm = LmforgeLM("runs/gpt/model", batch_size=16)
    lm.loglikelihood([Instance("loglikelihood", {}, ("The cat", " sat"), 0)])   # [(-7.1, False)]
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from lmforge.checkpoint import read_model_folder
from lmforge.errors import UserInputError
from lmforge.generation import generate

try:  # the [harness] extra; without it the class below is a plain object that register() refuses to offer
    from lm_eval.api.model import TemplateLM
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError:  # pragma: no cover - exercised only where the extra is missing
    TemplateLM = object
    get_rolling_token_windows = make_disjoint_window = None

MODEL_NAME = "lmforge"
HARNESS_MISSING = "lm-evaluation-harness is not installed: pip install 'lmforge[harness]' (lm_eval>=0.4.5)"


class LmforgeLM(TemplateLM):
    """An lmforge decoder as an lm_eval model.

    Args:
        pretrained: a model folder (lmforge, run or HF folder), as ``--model_args pretrained=DIR``; or None with
            ``model`` and ``tokenizer`` given.
        model, tokenizer: an lmforge decoder and its Tokenizer, instead of a folder.
        batch_size: rows per forward pass when scoring, prompts per generation batch.
        device: ``cpu`` or ``cuda``.
        max_length: the window of rolling loglikelihood and the left-truncation of long requests (default: the
            model's ``max_seq_len``).
        max_gen_toks: generate_until's token limit when a task gives none (lm_eval's default, 256).
    """

    def __init__(self, pretrained: str | None = None, *, model=None, tokenizer=None, batch_size: int | str = 16,
                 device: str | None = "cpu", max_length: int | str | None = None, max_gen_toks: int | str = 256,
                 **_ignored: Any) -> None:
        if TemplateLM is object:
            raise UserInputError(HARNESS_MISSING)
        super().__init__()
        if model is None:
            if pretrained is None:
                raise UserInputError("the lmforge harness model needs a folder: --model_args pretrained=DIR")
            model, tokenizer = read_model_folder(pretrained)
        cfg = model.config
        if cfg.arch != "decoder" or cfg.head != "lm":
            raise UserInputError(f"lm-evaluation-harness scores text with a decoder language model, not "
                                 f"{cfg.name!r} (arch={cfg.arch}, head={cfg.head})")
        if tokenizer is None:
            raise UserInputError(f"{pretrained}: the folder has no tokenizer.json; lm_eval needs text in and out")
        if str(batch_size).startswith("auto"):
            raise UserInputError("batch_size auto: give a number of rows (lmforge does not probe memory)")
        self.model = model.to(device or "cpu").eval()
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self._device = torch.device(device or "cpu")
        self.max_length = int(max_length) if max_length else cfg.max_seq_len
        if self.max_length > cfg.max_seq_len:
            raise UserInputError(f"max_length={self.max_length} is over the model's max_seq_len={cfg.max_seq_len}")
        self.max_gen_toks = int(max_gen_toks)
        self.source = str(pretrained) if pretrained is not None else cfg.name
        special = tokenizer.special_token_ids()
        self._bos, self._eos = special.get("bos_token_id"), special.get("eos_token_id")
        if self._eos is None and self._bos is None:
            raise UserInputError(f"{self.source}: the tokenizer has neither BOS nor EOS, so an empty context has "
                                 "no token to start from")

    # ----------------------------------------------------------------- tokens
    @property
    def eot_token_id(self) -> int:
        return self._eos if self._eos is not None else self._bos

    @property
    def prefix_token_id(self) -> int:
        """The token an empty context starts from: BOS, else EOS (as lm_eval's ``hf`` backend)."""
        return self._bos if self._bos is not None else self._eos

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        ids = self.tokenizer.encode(string, add_special_tokens=False)
        # A family with its own BOS (Llama) starts every text with it, as its HF tokenizer does; GPT's BOS is
        # its EOS, which HF's GPT-2 tokenizer never adds.
        own_bos = self._bos is not None and self._bos != self._eos
        if own_bos and add_special_tokens is not False and ids[:1] != [self._bos]:
            ids = [self._bos] + ids
        return ids

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # ----------------------------------------------------------------- scoring
    @torch.no_grad()
    def score(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[tuple[float, bool]]:
        """(context ids, continuation ids) pairs -> (summed log-probability of the continuation, whether every
        continuation token is the argmax), in the order given. The context is cut from the left to fit
        ``max_length`` positions; it must hold at least one token."""
        results: list[tuple[float, bool] | None] = [None] * len(rows)
        # Longest first, so each batch pads little and a too-large batch fails at once.
        order = sorted(range(len(rows)), key=lambda i: -(len(rows[i][0]) + len(rows[i][1])))
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            for i, result in zip(batch, self._score_batch([rows[i] for i in batch])):
                results[i] = result
        return results  # type: ignore[return-value]

    def _score_batch(self, rows) -> list[tuple[float, bool]]:
        inputs, targets = [], []
        for context, continuation in rows:
            if not context or not continuation:
                raise ValueError("a scored row needs at least one context and one continuation token")
            if len(continuation) > self.max_length:
                raise UserInputError(f"a continuation of {len(continuation)} tokens is longer than max_length="
                                     f"{self.max_length}: it cannot be scored in one window of this model")
            whole = (list(context) + list(continuation))[-(self.max_length + 1):]
            inputs.append(whole[:-1])
            targets.append(whole[-len(continuation):])
        T = max(len(x) for x in inputs)
        keep = max(len(t) for t in targets)
        pad = self.eot_token_id
        ids = torch.tensor([[pad] * (T - len(x)) + x for x in inputs], device=self._device)  # (B, T), left-padded
        real = torch.tensor([[0] * (T - len(x)) + [1] * len(x) for x in inputs], device=self._device)  # (B, T)
        positions = (real.cumsum(-1) - 1).clamp_min(0)  # (B, T): 0.. over real tokens
        logits = self.model(ids, attention_mask=real, position_ids=positions, logits_to_keep=keep).logits  # (B, K, V)
        out = []
        for b, target in enumerate(targets):
            n = len(target)
            logp = F.log_softmax(logits[b, keep - n:].float(), dim=-1)  # (n, V): the positions before each target
            want = torch.tensor(target, device=self._device)
            out.append((float(logp.gather(-1, want[:, None]).sum()), bool((logp.argmax(-1) == want).all())))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        results = self.score([(ctx, cont) for _, ctx, cont in requests])
        for (key, _, _), result in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def rolling_windows(self, ids: Sequence[int]) -> list[tuple[list[int], list[int]]]:
        """The (context, continuation) windows that score every token of ``ids`` once (lm_eval's own)."""
        windows = get_rolling_token_windows(token_list=list(ids), prefix_token=self.prefix_token_id,
                                            max_seq_len=self.max_length, context_len=1)
        return [make_disjoint_window(w) for w in windows]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for r, request in enumerate(requests):
            for window in self.rolling_windows(self.tok_encode(request.args[0])):
                windows.append(window)
                owner.append(r)
        totals = [0.0] * len(requests)
        for r, (logp, _) in zip(owner, self.score(windows)):
            totals[r] += logp
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # ----------------------------------------------------------------- generation
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or, with ``do_sample``, sampled) continuations, cut before the first ``until`` string."""
        results: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items())), []).append(i)
        for members in groups.values():
            settings = dict(requests[members[0]].args[1])
            until = settings.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(settings.pop("max_gen_toks", self.max_gen_toks))
            options = self._generation_options(settings, max_new)
            room = self.max_length - max_new  # prompt tokens kept (from the right), as lm_eval's hf backend
            if room < 1:
                raise UserInputError(f"max_gen_toks={max_new} leaves no room for a prompt in max_length="
                                     f"{self.max_length} tokens: lower the task's max_gen_toks")
            for start in range(0, len(members), self.batch_size):
                batch = members[start:start + self.batch_size]
                prompts = [self.tok_encode(requests[i].args[0])[-room:] or [self.prefix_token_id]
                           for i in batch]
                out = generate(self.model, prompts, **options)
                for i, new in zip(batch, out.tolist()):
                    text = self.tok_decode(new)
                    for stop in until:
                        text = text.split(stop)[0] if stop else text
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return results  # type: ignore[return-value]

    @staticmethod
    def _generation_options(settings: dict, max_new: int) -> dict:
        """lm_eval's generation kwargs as lmforge's settings: greedy unless ``do_sample`` with a temperature > 0
        (lm_eval's convention), and then its temperature, top_k and top_p."""
        sample = bool(settings.get("do_sample", False)) and float(settings.get("temperature", 1.0) or 0) > 0
        options: dict[str, Any] = {"max_new_tokens": max_new, "strategy": "sample" if sample else "greedy"}
        if sample:
            kinds = {"temperature": float, "top_k": int, "top_p": float}
            options.update({k: kind(settings[k]) for k, kind in kinds.items() if settings.get(k) is not None})
        return options

    def get_model_info(self) -> dict:
        """What lm_eval records of the model in its results' ``config``."""
        cfg = self.model.config
        return {"model_source": self.source, "model_name": cfg.name, "max_length": self.max_length,
                "parameters": sum(p.numel() for p in self.model.parameters())}


@functools.cache
def register() -> type:
    """Register :class:`LmforgeLM` with lm_eval as ``lmforge`` (once); UserInputError if lm_eval is missing."""
    if TemplateLM is object:
        raise UserInputError(HARNESS_MISSING)
    import lm_eval.models  # noqa: F401 - lm_eval fills its own registry lazily only while it is empty
    from lm_eval.api.registry import register_model

    return register_model(MODEL_NAME)(LmforgeLM)
