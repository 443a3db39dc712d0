"""Fill-mask probes: the model's top-k fillers for a blank, "what pre-training teaches" (Petroni et al. 2019).

The blank is written ``[MASK]`` whatever the model; each family reads it the way it was pre-trained:

    family                    input                                   distribution read
    encoder (MLM head)        the text, [MASK] -> its mask token      softmax of the MLM logits at the mask
    decoder                   the text before [MASK] (or all of it)   softmax of the next-token logits
    encoder-decoder, T5       [MASK] -> <extra_id_0>; decoder reads   softmax of the token after the sentinel
                              [start, <extra_id_0>]                   (T5's span-corruption target format)
    encoder-decoder, BART     [MASK] -> <mask>; decoder reads the     softmax of the next decoder token
                              text before the mask                    (BART reconstructs the whole text)

Probabilities are P(token | context) over the vocabulary, so the top-k of an encoder equal those of Hugging
Face's ``fill-mask`` pipeline on the same weights.

Candidates of several tokens (``--candidates "New York,Paris"``) are ranked by their log-likelihood in the
blank: decoders, T5 and BART by the chain rule, ``sum_j log P(c_j | context, c_<j)``; encoders by the
pseudo-log-likelihood of Salazar et al. (2020), ``sum_j log P(c_j | text with only c_j masked)``. For a
one-token candidate each equals the log of its fill-mask probability.

Example:
    >>> import torch
    >>> top_k(torch.tensor([0.0, 2.0, 1.0]), 2)
    [(1, 0.665241), (2, 0.244728)]
"""

from __future__ import annotations

import torch

from lmforge.errors import UserInputError

MASK = "[MASK]"


def top_k(logits: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """(V,) logits -> the ``k`` most probable ``(token id, probability)`` pairs (softmax over V)."""
    probs = torch.softmax(logits.float(), -1)
    values, ids = probs.topk(min(k, probs.numel()))
    return [(int(i), round(float(v), 6)) for i, v in zip(ids, values)]


def _strip_eos(ids: list[int], eos: int | None) -> list[int]:
    return ids[:-1] if ids and eos is not None and ids[-1] == eos else ids


@torch.no_grad()
def fill_mask(model, tokenizer, text: str, k: int = 10) -> list[dict]:
    """The ``k`` best fillers of the ``[MASK]`` in ``text``: ``[{"token", "id", "probability"}, ...]``.

    Raises:
        UserInputError: no or several ``[MASK]`` where the family needs one, or an encoder without an MLM head.
    """
    cfg = model.config
    roles = tokenizer.special_token_ids()
    n_masks = text.count(MASK)
    if n_masks > 1 or (n_masks == 0 and cfg.arch != "decoder"):
        raise UserInputError(f"the text needs exactly one {MASK} (it has {n_masks}): {text!r}")
    model.eval()
    device = next(model.parameters()).device
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else roles.get("eos_token_id")
    if cfg.arch == "encoder":
        if cfg.head != "mlm":
            raise UserInputError(f"fill-mask on an encoder needs its MLM head; this model has head={cfg.head!r}")
        mask_id = roles.get("mask_token_id")
        if mask_id is None:
            raise UserInputError("the tokenizer has no mask token, so the encoder cannot be asked to fill one")
        ids = tokenizer.encode(text.replace(MASK, tokenizer.special_token("mask")))
        position = ids.index(mask_id)
        logits = model(torch.tensor([ids], device=device)).logits[0, position]  # (V,)
    elif cfg.arch == "decoder":
        prefix = text.split(MASK, 1)[0].rstrip()
        ids = _strip_eos(tokenizer.encode(prefix), eos)
        if not ids:
            raise UserInputError(f"a decoder fills the next token after the text before {MASK}; that text is empty")
        logits = model(torch.tensor([ids], device=device)).logits[0, -1]
    else:
        start = cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else (cfg.pad_token_id or 0)
        if tokenizer.sentinels:  # T5: the blank is a sentinel, and the target starts by naming it
            sentinel = tokenizer.sentinels[0]
            enc = tokenizer.encode(text.replace(MASK, sentinel))
            dec = [start, tokenizer.token_to_id(sentinel)]
        else:  # BART: the decoder rewrites the text, so it reads the part before the mask and goes on
            mask = tokenizer.special_token("mask")
            if mask is None:
                raise UserInputError("the tokenizer has neither sentinels nor a mask token to write the blank with")
            enc = tokenizer.encode(text.replace(MASK, mask))
            dec = [start] + _strip_eos(tokenizer.encode(text.split(MASK, 1)[0].rstrip()), eos)
        out = model(torch.tensor([enc], device=device), decoder_input_ids=torch.tensor([dec], device=device))
        logits = out.logits[0, -1]
    return [{"token": tokenizer.decode([i], skip_special_tokens=False).strip() or tokenizer.id_to_token(i),
             "id": i, "probability": p} for i, p in top_k(logits, k)]


def _candidate_positions(tokenizer, text: str, start: int, end: int) -> tuple[list[int], list[int]]:
    """Ids of ``text`` (with the family's specials) and the positions of the tokens inside characters
    ``[start, end)``. A byte-level BPE may give a space its own token with an empty, trimmed offset: it belongs
    to the candidate when it sits inside it; special tokens never do."""
    enc = tokenizer.encode_batch([text], return_offsets=True)
    ids, offsets = enc["input_ids"][0], enc["offsets"][0]
    specials = {v for k, v in tokenizer.special_token_ids().items() if k.endswith("_token_id")}
    inside = [p for p, (a, z) in enumerate(offsets)
              if ids[p] not in specials and a < end and (z > start if z > a else a >= start)]
    return ids, inside


@torch.no_grad()
def score_candidates(model, tokenizer, text: str, candidates: list[str]) -> list[dict]:
    """Each candidate's log-likelihood in the ``[MASK]`` of ``text`` (see the module docstring), best first:
    ``[{"candidate", "log_likelihood", "tokens"}, ...]``."""
    if text.count(MASK) != 1:
        raise UserInputError(f"the text needs exactly one {MASK} to score candidates in (it has {text.count(MASK)})")
    cfg = model.config
    model.eval()
    device = next(model.parameters()).device
    roles = tokenizer.special_token_ids()
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else roles.get("eos_token_id")
    at = text.index(MASK)
    results = []
    for cand in candidates:
        filled = text.replace(MASK, cand)
        if cfg.arch == "encoder":
            ids, inside = _candidate_positions(tokenizer, filled, at, at + len(cand))
            batch = torch.tensor([ids] * len(inside), device=device)  # one copy per candidate token
            rows = torch.arange(len(inside), device=device)
            cols = torch.tensor(inside, device=device)
            batch[rows, cols] = roles["mask_token_id"]
            logp = torch.log_softmax(model(batch).logits[rows, cols].float(), -1)  # (n, V)
            ll = float(logp[rows, torch.tensor([ids[p] for p in inside], device=device)].sum())
        elif cfg.arch == "decoder" or not tokenizer.sentinels:
            # Decoder: the text up to the candidate's end. BART: the decoder rewrites the whole filled text.
            piece = filled[:at + len(cand)] if cfg.arch == "decoder" else filled
            ids, inside = _candidate_positions(tokenizer, piece, at, at + len(cand))
            if cfg.arch == "decoder":
                ids = _strip_eos(ids, eos)
                if inside and inside[0] == 0:
                    raise UserInputError("a decoder cannot score a candidate at the very start of the text")
                logits = model(torch.tensor([ids], device=device)).logits[0]  # (T, V): position p-1 predicts p
                shift = -1
            else:
                start = cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else (cfg.pad_token_id or 0)
                enc = tokenizer.encode(text.replace(MASK, tokenizer.special_token("mask")))
                dec = torch.tensor([[start] + ids[:-1]], device=device)  # decoder position p predicts ids[p]
                logits = model(torch.tensor([enc], device=device), decoder_input_ids=dec).logits[0]
                shift = 0
            logp = torch.log_softmax(logits.float(), -1)
            ll = float(sum(logp[p + shift, ids[p]] for p in inside))
        else:  # T5: the target "<extra_id_0> c_1 ... c_n" after the decoder start
            start = cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else (cfg.pad_token_id or 0)
            sentinel = tokenizer.sentinels[0]
            enc = tokenizer.encode(text.replace(MASK, sentinel))
            inside_ids = _strip_eos(tokenizer.encode(cand), eos)
            dec = [start, tokenizer.token_to_id(sentinel)] + inside_ids
            logits = model(torch.tensor([enc], device=device), decoder_input_ids=torch.tensor([dec[:-1]], device=device)).logits[0]
            logp = torch.log_softmax(logits.float(), -1)
            ll = float(sum(logp[1 + j, t] for j, t in enumerate(inside_ids)))
            inside = inside_ids
        results.append({"candidate": cand, "log_likelihood": round(ll, 6), "tokens": len(inside)})
    return sorted(results, key=lambda r: -r["log_likelihood"])
