"""``generate``: prompts in, new tokens out; ``generate_text`` and ``stream`` for text.

    generate(model, ids)            (B, T) ids or ragged lists -> GenerationOutput (new tokens only)
    generate_text(model, tok, ps)   strings -> strings (the continuations)
    stream(model, tok, prompt)      one string -> iterator of new text, piece by piece

Settings come from a :class:`GenerationConfig` and/or keyword overrides (``max_new_tokens=20``,
``num_beams=4``, ``strategy="sample"``, ``compile=True`` for the compiled decode step of
:mod:`lmforge.generation.compiled`, ...). Generation runs in eval mode under
``torch.inference_mode`` and restores the model's mode after.

Prompts of different lengths may come as ragged lists or as a padded tensor with its mask (padded on
either side): decoder prompts are re-packed to the left, encoder sources to the right. Outputs hold only the new tokens: ``sequences``
(B * n, T) with ``pad_token_id`` after each sequence's end, ``lengths`` (B * n,) counting the ending
EOS, and for beam search the length-penalised ``scores`` (B * n,). With ``num_return_sequences=n``
the n outputs of prompt b are rows ``b * n .. b * n + n - 1``.

Example:
    >>> import torch, lmforge
    >>> model = lmforge.build_model("gpt-tiny")
    >>> out = generate(model, [[5, 6, 7], [8, 9]], max_new_tokens=4)      # ragged prompts
    >>> out.sequences.shape
    torch.Size([2, 4])
    >>> out = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4, strategy="sample", top_k=20, seed=1)
    >>> out.tolist() == model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4, strategy="sample",
    ...                                top_k=20, seed=1).tolist()
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from lmforge.generation.compiled import CompiledStepper
from lmforge.generation.config import GenerationConfig
from lmforge.generation.search import GenerationOutput, beam_search, greedy_or_sample, iter_tokens
from lmforge.generation.stepper import Stepper, pack
from lmforge.generation.stopping import EosCriterion, StopStrings, cut_at_stop
from lmforge.nn import gemv
from lmforge.nn.linear import decoding_weights
from lmforge.errors import UserInputError

# Absolute position tables end at max_seq_len; relative schemes and RoPE run past it (if less well).
_ABSOLUTE_POSITIONS = ("learned", "sinusoidal")


def resolve_config(config: GenerationConfig | None, settings: dict) -> GenerationConfig:
    config = config if config is not None else GenerationConfig()
    return config.replace(**settings) if settings else config


def _decode_weights(model) -> list[torch.Tensor]:
    """Weights that :mod:`lmforge.nn.linear` multiplies faster while decoding: those of plain Linears with
    out >= in, and the LM head's; only for fp32 CPU models (the forms are tuned for MKL), and none where
    lmforge's fp32 kernel takes decoding's rows (:mod:`lmforge.nn.gemv`: faster, and no copies to make)."""
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32 or model.lm_head is None or gemv.available():
        return []
    own = getattr(model.lm_head, "weight", False)  # False: an output layer of several matrices (adaptive softmax)
    head = own if own is not None else model.output_embedding
    weights = [m.weight for m in model.modules() if type(m) is nn.Linear]
    if isinstance(head, torch.Tensor):  # a quantised table multiplies with its own kernels
        weights.append(head)
    return [w for w in weights if w.shape[0] >= w.shape[1]]


@contextlib.contextmanager
def _decoding(model, config: GenerationConfig):
    """Eval mode (dropout would make every step random) and the decoding forms of the weights. Not for
    compiled decoding: the compiled graph multiplies by the weights as they are (its own kernels), and
    the registry's id() lookups are nothing to trace."""
    # Walked rather than set: a model already in eval mode (the usual case) is left alone, where eval() and
    # train() would each visit every module of it on every call.
    switch = any(m.training for m in model.modules())
    was_training = model.training
    if switch:
        model.eval()
    try:
        with decoding_weights([] if config.compile else _decode_weights(model)):
            yield
    finally:
        if switch:
            model.train(was_training)


class _Run:
    """Everything one generation call needs, resolved from the model, the config and the prompts."""

    def __init__(self, model, input_ids, attention_mask, config: GenerationConfig, tokenizer):
        mc = model.config
        if mc.arch == "encoder" or mc.head != "lm":
            raise UserInputError(
                f"model {mc.name!r} (arch={mc.arch}, head={mc.head}) cannot generate: generation needs a "
                "decoder or encoder-decoder with an LM head"
            )
        if config.stop_strings and tokenizer is None:
            raise ValueError("stop_strings need a tokenizer to decode the generated text; pass tokenizer=")
        self.config = config
        eos = config.eos_token_id if config.eos_token_id is not None else mc.eos_token_id
        eos_ids = [] if config.ignore_eos or eos is None else [eos] if isinstance(eos, int) else list(eos)
        self.eos = EosCriterion(eos_ids)
        pad = config.pad_token_id
        if pad is None:
            pad = mc.pad_token_id if mc.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
        self.pad_id = pad
        self.stop = StopStrings(config.stop_strings, tokenizer.decode) if config.stop_strings else None
        device = next(model.parameters()).device
        self.generator = None
        if config.seed is not None:
            self.generator = torch.Generator(device).manual_seed(config.seed)

        ids, mask = pack(input_ids, attention_mask, pad, side="left" if mc.arch == "decoder" else "right")
        if mc.arch == "decoder":
            real = mask.sum(-1) if mask is not None else torch.full((ids.shape[0],), ids.shape[1])
            if ids.shape[1] == 0 or bool((real == 0).any()):
                raise UserInputError("a decoder prompt is empty: give at least one token (e.g. BOS) per prompt")
            longest = int(real.max()) + config.max_new_tokens - 1  # the last new token is never fed back
        else:
            longest = max(config.max_new_tokens, ids.shape[-1])
        if mc.position in _ABSOLUTE_POSITIONS and longest > mc.max_seq_len:
            raise UserInputError(
                f"prompt + max_new_tokens needs {longest} positions but model {mc.name!r} has "
                f"max_seq_len={mc.max_seq_len} ({mc.position} positions); shorten the prompt or max_new_tokens"
            )
        ids = ids.to(device)
        mask = mask.to(device) if mask is not None else None
        start = config.decoder_start_token_id
        start = start if start is not None else model._decoder_start_id()
        if config.compile:
            self.stepper = CompiledStepper(model, ids, mask, config.max_new_tokens, start, pad,
                                           whole=config.compile is True)
        else:
            self.stepper = Stepper(model, ids, mask, config.max_new_tokens, start, pad, config.use_cache)
        self.batch_size = ids.shape[0]

    def search(self) -> GenerationOutput:
        cfg, s = self.config, self.stepper
        if cfg.resolved_strategy == "beam":
            return beam_search(s, cfg, self.eos, self.pad_id, self.stop)
        if cfg.num_return_sequences > 1:  # n independent samples per prompt
            s.select(torch.arange(self.batch_size, device=s.tokens.device).repeat_interleave(cfg.num_return_sequences))
        return greedy_or_sample(s, cfg, self.eos, self.pad_id, self.stop, self.generator)


def generate(
    model,
    input_ids: torch.Tensor | Sequence[Sequence[int]],
    attention_mask: torch.Tensor | None = None,
    config: GenerationConfig | None = None,
    *,
    tokenizer=None,
    **settings,
) -> GenerationOutput:
    """Generate new tokens after each prompt (decoders) or for each source (encoder-decoders).

    Args:
        model: an lmforge Transformer with an LM head.
        input_ids: (B, T) ids, a (T,) single prompt (tensor or list), or B lists of ids of any lengths.
        attention_mask: (B, T) with 1 for real tokens (either padding side), or None.
        config: settings; keyword ``settings`` override single fields.
        tokenizer: needed for ``stop_strings`` (anything with ``decode(ids) -> str``).

    Returns:
        :class:`GenerationOutput` with the new tokens (see the module docstring).
    """
    config = resolve_config(config, settings)
    with torch.inference_mode(), _decoding(model, config):
        out = _Run(model, input_ids, attention_mask, config, tokenizer).search()
    # Plain tensors again: inference tensors refuse in-place edits outside inference mode.
    return GenerationOutput(
        out.sequences.clone(), out.lengths.clone(), out.scores.clone() if out.scores is not None else None
    )


def encode_prompt(model, tokenizer, text: str) -> list[int]:
    """Prompt ids: sources get the tokenizer's template (``<s> A </s>``, ``A </s>``); decoder prompts get
    no template, since a trailing EOS would end them, but a leading BOS when the family has its own
    (Llama style; GPT's BOS is its EOS, so GPT-2 prompts start bare unless empty)."""
    if model.config.arch == "encoder-decoder":
        return tokenizer.encode(text)
    ids = tokenizer.encode(text, add_special_tokens=False)
    special = tokenizer.special_token_ids()
    bos, eos = special.get("bos_token_id"), special.get("eos_token_id")
    if bos is not None and (bos != eos or not ids):
        ids = [bos] + ids
    elif not ids and eos is not None:
        ids = [eos]  # unconditional generation from the document boundary
    return ids


def decode_outputs(tokenizer, out: GenerationOutput, stop_strings: Sequence[str] = ()) -> list[str]:
    """Texts of the new tokens; with stop strings, each cut right after its first stop string."""
    texts = [tokenizer.decode(ids) for ids in out.tolist()]
    return [cut_at_stop(t, stop_strings) for t in texts] if stop_strings else texts


def generate_text(
    model, tokenizer, prompts: str | Sequence[str], config: GenerationConfig | None = None, **settings
) -> list[str]:
    """Continuations of ``prompts`` (a string or a list); ``num_return_sequences`` texts per prompt.

    Example (``model`` and ``tok``: a trained model and its tokenizer; the example of :func:`stream` runs
    both functions on an untrained one)::

        generate_text(model, tok, ["Once upon a time"], max_new_tokens=20)  # [' there was a ...']
    """
    config = resolve_config(config, settings)
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    ids = [encode_prompt(model, tokenizer, p) for p in prompts]
    out = generate(model, ids, config=config, tokenizer=tokenizer)
    return decode_outputs(tokenizer, out, config.stop_strings)


class TextStream:
    """Turns one sequence's tokens, pushed one at a time, into the text each adds.

    Decoding the whole sequence each time (not token by token) keeps multi-byte characters and
    tokenizer spacing rules right; a text ending in U+FFFD is a character still missing bytes, so it is
    held back until they arrive, or until :meth:`flush` at the end.

    Example:
        >>> ts = TextStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
        >>> [ts.push(b) for b in "a☃".encode()] + [ts.flush()]
        ['a', '', '', '☃', '']
    """

    def __init__(self, decode, stop_strings: Sequence[str] = ()):
        self.decode = decode
        self.stop_strings = list(stop_strings)
        self.ids: list[int] = []
        self.shown = ""

    def _text(self) -> str:
        text = self.decode(self.ids)
        return cut_at_stop(text, self.stop_strings) if self.stop_strings else text

    def push(self, token: int) -> str:
        """Add a token; return the new printable text ("" while a character is incomplete)."""
        self.ids.append(token)
        text = self._text()
        if text.endswith("\ufffd"):
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """Whatever is still held back, replacement characters and all."""
        return self._advance(self._text())

    def _advance(self, text: str) -> str:
        # Text only grows as tokens are added (cleanup rules aside, which at worst re-render a
        # character already shown): what lies beyond the shown part is new.
        piece = text[len(self.shown):]
        if piece:
            self.shown = text
        return piece


def stream(
    model, tokenizer, prompt: str, config: GenerationConfig | None = None, **settings
) -> Iterator[str]:
    """Yield the continuation of one prompt piece by piece, as soon as each token is chosen.

    The pieces join to ``generate_text(...)[0]`` with the same settings. Beam search knows its best
    hypothesis only at the end, so it yields the whole text once.

    Example:
        >>> import pathlib, tempfile, torch, lmforge
        >>> from lmforge.tokenization import train_tokenizer
        >>> corpus = pathlib.Path(tempfile.mkdtemp()) / "corpus.txt"
        >>> _ = corpus.write_text("Once upon a time there was a cat.\\n" * 50)
        >>> tok = train_tokenizer([corpus], kind="byte-bpe", family="gpt", vocab_size=300, show_progress=False)
        >>> _ = torch.manual_seed(0)
        >>> model = lmforge.build_model("gpt-tiny", vocab_size=len(tok), n_layers=1).eval()  # untrained: noise
        >>> pieces = []
        >>> for piece in stream(model, tok, "Once upon a time", max_new_tokens=20):
        ...     pieces.append(piece)  # or show it at once: print(piece, end="", flush=True)
        >>> "".join(pieces) == generate_text(model, tok, "Once upon a time", max_new_tokens=20)[0]
        True
    """
    config = resolve_config(config, settings)
    if config.resolved_strategy == "beam" or config.num_return_sequences > 1:
        yield generate_text(model, tokenizer, prompt, config)[0]
        return
    ids = [encode_prompt(model, tokenizer, prompt)]
    with _decoding(model, config):
        # Inference mode is entered per step, not held across ``yield``: the caller's code between
        # pieces must not run inside it.
        with torch.inference_mode():
            run = _Run(model, ids, None, config, tokenizer)
            steps = iter_tokens(run.stepper, config, run.eos, run.pad_id, run.stop, run.generator)
        text = TextStream(tokenizer.decode, config.stop_strings)
        while True:
            with torch.inference_mode():
                item = next(steps, None)
            if item is None:
                break
            tokens, done = item
            piece = text.push(int(tokens[0]))
            if piece:
                yield piece
            if bool(done[0]):
                break
        piece = text.flush()
        if piece:
            yield piece
