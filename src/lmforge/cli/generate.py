"""``lmforge generate``: continue prompts with a model folder (greedy, beam search or sampling).

Example::

    $ lmforge generate --model runs/gpt --prompt "Once upon a time" --max-new-tokens 50
    $ lmforge generate --model runs/gpt --prompt "Once upon a time" --strategy sample --top-p 0.9 --seed 0
    $ lmforge generate --model runs/t5 --prompt-file article.txt --strategy beam --num-beams 4 --no-stream
    $ lmforge generate --model runs/gpt --prompt "Once upon a time" --max-new-tokens 500 --compile
    $ lmforge generate --model runs/gpt --prompt "Who built the ark?" --index runs/verses-index -k 3

One output is streamed as it is generated (``--no-stream`` prints it at the end); several outputs
(several prompts, or ``--num-return-sequences``) are generated as one batch and printed each under a
``==> prompt P, output K <==`` header. With ``--index`` each prompt is first filled into ``--rag-template`` with its
top-k passages (:mod:`lmforge.prompting.rag`), and stderr names them. Errors are one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import sys

import lmforge
from lmforge.cli._load_args import add_load_flags, add_precision_flags
from lmforge.cli._price_args import add_price_tag_flags
from lmforge.cli._rag_args import add_rag_flags, rag_settings
from lmforge.cli.main import UserError, model_argument, plain_warnings
from lmforge.generation import GenerationConfig, generate_text, stream
from lmforge.tokenization import Tokenizer
from lmforge.training.held_out import note_for
from lmforge.utils.io import read_text_file


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="generate text from a model folder (greedy, beam search, sampling)",
        description="Continue one or more prompts with a model folder (config.json + model.safetensors + "
        "tokenizer.json). Decoder prompts are continued; encoder-decoder models (T5, BART) read the prompt as "
        "their source. Generation uses a KV cache; several prompts run as one left-padded batch.",
    )
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="model folder holding tokenizer.json, or a run folder (then its best/, else its model/)")
    parser.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="a prompt (repeatable)")
    parser.add_argument("--prompt-file", action="append", default=[], metavar="FILE",
                        help="a file whose whole text is one prompt; '-' reads stdin (repeatable)")
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate at most (64)")
    parser.add_argument("--strategy", choices=("greedy", "beam", "sample"), default="greedy",
                        help="how the next token is chosen (greedy)")
    beam = parser.add_argument_group("beam search")
    beam.add_argument("--num-beams", type=int, default=None, metavar="N", help="beam width (4 with --strategy beam)")
    beam.add_argument("--length-penalty", type=float, default=1.0, metavar="L",
                      help="finished beams score sum(log p) / length**L; L > 0 favours longer outputs (1.0)")
    beam.add_argument("--early-stopping", choices=("true", "false", "never"), default="false",
                      help="true: stop once num-beams hypotheses finished; false (default) / never: when no running "
                      "beam can beat them, judged at the current / the maximum length")
    beam.add_argument("--num-return-sequences", type=int, default=1, metavar="N",
                      help="outputs per prompt: the n best beams, or n independent samples (1)")
    sample = parser.add_argument_group("sampling")
    sample.add_argument("--temperature", type=float, default=1.0, metavar="T", help="divide the logits by T (1.0)")
    sample.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K most likely tokens")
    sample.add_argument("--top-p", type=float, default=1.0, metavar="P",
                        help="nucleus: sample among the fewest most likely tokens holding probability P (1.0 = off)")
    sample.add_argument("--min-p", type=float, default=None, metavar="P",
                        help="drop tokens less likely than P times the most likely one")
    sample.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    shared = parser.add_argument_group("all strategies")
    shared.add_argument("--repetition-penalty", type=float, default=1.0, metavar="P",
                        help="penalise tokens already in the text; P > 1 discourages repeats (1.0 = off)")
    shared.add_argument("--no-repeat-ngram-size", type=int, default=0, metavar="N",
                        help="never repeat an N-gram (0 = off)")
    shared.add_argument("--stop", action="append", default=[], metavar="STR",
                        help="end an output once it contains STR (repeatable); the text ends with STR")
    shared.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    shared.add_argument("--compile", nargs="?", const="cached", choices=("cached", "now"), metavar="WHEN",
                        help="decode through a torch.compile-d step over a static KV cache, faster per token; "
                        "decoders with learned/sinusoidal/RoPE positions only. Bare (or 'cached'): where this "
                        "machine's compile cache lacks an int8 or bf16 step, decode eagerly rather than wait tens "
                        "of seconds for it, and build it as this process exits, for the next one (fp32 steps "
                        "compile now). 'now': compile before decoding (an int8 or bf16 step of one or two rows "
                        "whole: a longer start, faster tokens)")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                        help="print a single output as it is generated (on by default)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu (default) or cuda")
    add_load_flags(parser)
    add_precision_flags(parser)
    add_price_tag_flags(parser, "generate")
    add_rag_flags(parser)
    parser.set_defaults(func=run)


def _prompts(args) -> list[str]:
    prompts = list(args.prompt)
    for name in args.prompt_file:
        prompts.append(sys.stdin.read() if name == "-" else read_text_file(name, "--prompt-file"))
    if not prompts:
        raise UserError("give a prompt with --prompt TEXT or --prompt-file FILE")
    return prompts


def _config(args):
    num_beams = args.num_beams if args.num_beams is not None else (4 if args.strategy == "beam" else 1)
    early = {"true": True, "false": False, "never": "never"}[args.early_stopping]
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens, strategy=args.strategy, num_beams=num_beams,
        length_penalty=args.length_penalty, early_stopping=early, num_return_sequences=args.num_return_sequences,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, no_repeat_ngram_size=args.no_repeat_ngram_size,
        stop_strings=args.stop, ignore_eos=args.ignore_eos, seed=args.seed,
        compile={None: False, "cached": "cached", "now": True}[args.compile],
    )


def _retrieve(args, prompts: list[str], k: int, template: str) -> list[str]:
    """The prompts with their passages in; which passages (index row, cosine) each got goes to stderr."""
    from lmforge.prompting.rag import open_retriever

    retriever = open_retriever(args.index, args.rag_model, device=args.device)
    filled, passages = retriever.prompts(prompts, k, template)
    for number, hits in enumerate(passages, 1):
        used = ", ".join(f"{p.id} ({p.score:.4f})" for p in hits)
        print(f"lmforge generate: prompt {number}: passages {used} from {args.index}", file=sys.stderr, flush=True)
    return filled


def run(args) -> int:
    with plain_warnings("generate"):
        return _run(args)


def _run(args) -> int:
    config = _config(args)  # bad settings fail before the model is loaded
    prompts = _prompts(args)
    rag = rag_settings(args)
    folder = model_argument("generate", args.model)
    if not folder.is_dir():
        raise UserError(f"--model {folder}: not a model folder")
    if not (folder / "tokenizer.json").is_file():
        raise UserError(f"--model {folder}: no tokenizer.json (save the model with its tokenizer)")

    if rag is not None:  # the index is checked (folder, encoder) before the generator is loaded
        prompts = _retrieve(args, prompts, *rag)
    model = lmforge.load(folder, device=args.device)
    tokenizer = Tokenizer.load(folder)
    note = note_for(folder)  # a model still at the word-frequency level repeats one token: say so first
    if note:
        print(f"lmforge generate: {note}", file=sys.stderr, flush=True)
    if args.stream and len(prompts) == 1 and config.num_return_sequences == 1:
        for piece in stream(model, tokenizer, prompts[0], config):
            print(piece, end="", flush=True)
        print()
        return 0
    texts = generate_text(model, tokenizer, prompts, config)
    n = config.num_return_sequences
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"==> prompt {i // n + 1}, output {i % n + 1} <==")
        print(text)
    return 0
