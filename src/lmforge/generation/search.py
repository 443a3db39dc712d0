"""Search: greedy / sampling token by token, and beam search.

Greedy and sampling share one loop (:func:`iter_tokens`), a generator that yields each step's tokens,
so ``generate`` drains it and streaming decodes as it goes. Per step it costs one model call, the
token choice and an end-of-sequence test; processors run only when configured.

Beam search follows Hugging Face's definition, so results agree token for token:

* every step, each of the ``k`` running beams is extended by every token, scored by its summed
  log-probability (after the processors), and the best ``2k`` candidates are kept (a larger pool when
  there are several EOS ids, so ``k`` unfinished ones always remain);
* a candidate that ends (EOS, stop string, or the length limit) among the top ``k`` becomes a finished
  hypothesis scored ``sum_logprobs / n_new_tokens ** length_penalty``; the ``k`` best finished ones
  are kept;
* the ``k`` best unfinished candidates run on;
* a prompt is done when ``early_stopping=True`` and ``k`` hypotheses finished, or (False / "never")
  when the best running beam can no longer beat the worst finished one: scored at its current length,
  or for "never" with a positive length penalty at the maximum length.

Example:
    >>> import torch, lmforge
    >>> from lmforge.generation.config import GenerationConfig
    >>> from lmforge.generation.stepper import Stepper
    >>> model = lmforge.build_model("gpt-tiny").eval()
    >>> cfg = GenerationConfig(max_new_tokens=4, num_beams=3, num_return_sequences=2)
    >>> stepper = Stepper(model, torch.tensor([[5, 6, 7]]), None, 4, start_id=0, pad_id=0)
    >>> with torch.inference_mode():
    ...     out = beam_search(stepper, cfg, eos=EosCriterion([]), pad_id=0)
    >>> out.sequences.shape, out.scores.shape                     # (B * n, T_new), (B * n,)
    (torch.Size([2, 4]), torch.Size([2]))
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lmforge.generation.config import GenerationConfig
from lmforge.generation.sampling import LogitsPipeline
from lmforge.generation.stepper import Stepper
from lmforge.generation.stopping import EosCriterion, StopStrings

_FINISHED = -1.0e9  # score of an empty / excluded slot; HF's constant, so ties break alike


@dataclass
class GenerationOutput:
    """New tokens: ``sequences`` (N, T) with pad after each end, ``lengths`` (N,) counting the ending
    EOS, and for beam search the length-penalised ``scores`` (N,), else None."""

    sequences: torch.Tensor
    lengths: torch.Tensor
    scores: torch.Tensor | None = None

    def tolist(self) -> list[list[int]]:
        """Each output's new tokens, without the padding after its end."""
        return [row[:n] for row, n in zip(self.sequences.tolist(), self.lengths.tolist())]


def iter_tokens(
    stepper: Stepper,
    config: GenerationConfig,
    eos: EosCriterion,
    pad_id: int,
    stop: StopStrings | None = None,
    generator: torch.Generator | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Greedy or sampled decoding; yields ``(tokens, done)`` per step, each (N,).

    ``tokens`` are the new tokens (pad for sequences that had already ended); ``done`` marks the
    sequences that have ended, this step included. Stops after ``max_new_tokens`` or when all ended.
    """
    sampling = config.resolved_strategy == "sample"
    processors = LogitsPipeline(config, sampling)
    N, device = stepper.batch_size, stepper.tokens.device
    done = torch.zeros(N, dtype=torch.bool, device=device)
    logits = stepper.prefill()  # (N, V)
    for i in range(config.max_new_tokens):
        scores = logits.float()
        if processors:
            L = stepper.length
            scores = processors(scores, stepper.tokens[:, :L], stepper.valid[:, :L])
        if sampling:
            tokens = torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(1)  # (N,)
        else:
            tokens = scores.argmax(-1)  # (N,)
        if eos or stop:
            tokens = tokens.masked_fill(done, pad_id)
            ended = eos(tokens) if eos else torch.zeros_like(done)
            if stop:
                start, L = stepper.prompt_len, stepper.length
                rows = torch.cat([stepper.tokens[:, start:L], tokens[:, None]], 1).tolist()
                ended |= torch.tensor(stop(rows), device=device)
            done = done | ended
        # Checking for the end reads a value back (a device sync), so only when something can end.
        last = i == config.max_new_tokens - 1 or ((eos or stop) and bool(done.all()))
        yield tokens, done  # before the next forward: a stream shows each token as soon as it exists
        logits = stepper.step(tokens, forward=not last)
        if last:
            return


# The same parameters as iter_tokens, which it drains.
def greedy_or_sample(
    stepper: Stepper,
    config: GenerationConfig,
    eos: EosCriterion,
    pad_id: int,
    stop: StopStrings | None = None,
    generator: torch.Generator | None = None,
) -> GenerationOutput:
    """Drain :func:`iter_tokens`: sequences (N, T_new) and their lengths (N,)."""
    lengths = torch.zeros(stepper.batch_size, dtype=torch.long, device=stepper.tokens.device)
    was_done = torch.zeros_like(lengths, dtype=torch.bool)
    for _, done in iter_tokens(stepper, config, eos, pad_id, stop, generator):
        lengths += ~was_done  # the ending token counts; tokens after it do not
        was_done = done
    return GenerationOutput(stepper.tokens[:, stepper.prompt_len:stepper.length], lengths)


def beam_search(
    stepper: Stepper,
    config: GenerationConfig,
    eos: EosCriterion,
    pad_id: int,
    stop: StopStrings | None = None,
) -> GenerationOutput:
    """Beam search (see the module docstring): the ``num_return_sequences`` best hypotheses per prompt,
    best first, as (B * n, T_new) sequences with their lengths and length-penalised scores."""
    k, T = config.num_beams, config.max_new_tokens
    lp, early = config.length_penalty, config.early_stopping
    processors = LogitsPipeline(config, sampling=False)
    B, device = stepper.batch_size, stepper.tokens.device
    K = max(2, 1 + len(eos.ids)) * k  # candidates kept per prompt and step
    rank_ok = torch.arange(K, device=device) < k  # only the top-k candidates may finish

    logits = stepper.prefill()  # (B, V): every beam of a prompt starts from the same state
    stepper.select(torch.arange(B, device=device).repeat_interleave(k))
    logits = logits.repeat_interleave(k, 0)  # (B*k, V)
    V = logits.shape[-1]
    group = torch.arange(B, device=device)[:, None] * k  # (B, 1): first row of each prompt's beams

    running = torch.full((B, k, T), pad_id, dtype=torch.long, device=device)  # running beams' new tokens
    running_scores = torch.full((B, k), _FINISHED, device=device)
    running_scores[:, 0] = 0.0  # the copies start equal; only one may spawn candidates at step 0
    best = torch.full((B, k, T), pad_id, dtype=torch.long, device=device)  # finished hypotheses
    best_scores = torch.full((B, k), _FINISHED, device=device)
    best_lengths = torch.zeros((B, k), dtype=torch.long, device=device)
    best_done = torch.zeros((B, k), dtype=torch.bool, device=device)  # slot holds a finished hypothesis
    improvable = torch.ones(B, dtype=torch.bool, device=device)

    for t in range(T):
        log_probs = logits.float().log_softmax(-1)  # (B*k, V)
        if processors:
            L = stepper.length
            log_probs = processors(log_probs, stepper.tokens[:, :L], stepper.valid[:, :L])
        totals = (log_probs.view(B, k, V) + running_scores[..., None]).view(B, k * V)
        cand_scores, flat = totals.topk(K, dim=-1)  # (B, K), best first
        cand_beam, cand_token = flat // V, flat % V  # (B, K)
        cand = running.gather(1, cand_beam[..., None].expand(B, K, T))  # (B, K, T), a new tensor
        cand[:, :, t] = cand_token

        ends = eos(cand_token) if eos else torch.zeros_like(cand_token, dtype=torch.bool)
        if t == T - 1:
            ends = torch.ones_like(ends)  # the length limit ends every candidate
        elif stop:
            ends |= torch.tensor(stop(cand[:, :, : t + 1].reshape(B * K, t + 1).tolist()), device=device).view(B, K)

        # Finished hypotheses: eligible candidates compete with the kept ones for the k slots.
        final = cand_scores / float(t + 1) ** lp
        eligible = ends & rank_ok & improvable[:, None]
        if early is True:
            eligible &= ~best_done.all(-1, keepdim=True)
        merged_scores = torch.cat([best_scores, torch.where(eligible, final, final + _FINISHED)], 1)
        keep = merged_scores.topk(k, dim=-1).indices  # (B, k)
        best_scores = merged_scores.gather(1, keep)
        best = torch.cat([best, cand], 1).gather(1, keep[..., None].expand(B, k, T))
        best_lengths = torch.cat([best_lengths, torch.full_like(cand_token, t + 1)], 1).gather(1, keep)
        best_done = torch.cat([best_done, eligible], 1).gather(1, keep)

        if bool(ends.all()):
            break
        # The k best candidates that did not end run on (if fewer did not end, HF runs dead ones too).
        alive = cand_scores + ends * _FINISHED
        pick = alive.topk(k, dim=-1).indices  # (B, k)
        running_scores = alive.gather(1, pick)
        running = cand.gather(1, pick[..., None].expand(B, k, T))
        origin = (cand_beam.gather(1, pick) + group).view(-1)  # (B*k,) rows they extend

        # Can a running beam still beat the worst kept hypothesis? Only asked once all slots are full.
        length = T if early == "never" and lp > 0 else t + 1
        hope = running_scores[:, 0] / float(length) ** lp
        improvable &= ~best_done.all(-1) | (hope > best_scores.min(-1).values)
        if not bool(improvable.any()) or (early is True and bool(best_done.all())):
            break
        stepper.select(origin, same_source=True)
        logits = stepper.step(running[:, :, t].reshape(-1))

    n = config.num_return_sequences
    lengths = best_lengths[:, :n].reshape(-1)
    width = int(lengths.max())
    return GenerationOutput(best[:, :n, :width].reshape(B * n, width), lengths, best_scores[:, :n].reshape(-1))
