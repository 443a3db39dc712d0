"""``lmforge convert``: Hugging Face model folders to lmforge model folders, and back.

Example::

    $ lmforge convert from-hf path/to/all-MiniLM-L6-v2 minilm/
    $ lmforge convert to-hf minilm/ minilm-hf/     # loads with transformers.AutoModel / AutoTokenizer
    $ lmforge convert to-gguf runs/gpt gpt.gguf --outtype q8_0   # loads with llama.cpp / llama-cpp-python

Errors (no config.json, an unsupported model type or field, a missing tensor, a shape mismatch) are
one line on stderr with exit code 2, and DST is left untouched.
"""

from __future__ import annotations

import json
import sys

from lmforge.checkpoint import model_source
from lmforge.cli._load_args import add_load_flags
from lmforge.cli.main import model_argument
from lmforge.interop.hf import convert_from_hf, convert_to_hf
from lmforge.interop.gguf import OUTTYPES as GGUF_OUTTYPES
from lmforge.interop.gguf import convert_to_gguf
from lmforge.utils.folder_kinds import require_kind

DTYPES = ("float32", "float16", "bfloat16")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert", help="convert Hugging Face model folders to lmforge and back; write GGUF for llama.cpp",
        description="Convert between Hugging Face model folders and lmforge model folders. Supported: BERT, "
        "RoBERTa, GPT-2, T5 (v1.0 and v1.1), BART, mBART, Llama, Qwen2 and Mistral. to-gguf writes a GPT-2, "
        "Llama, Qwen2 or Mistral decoder and its tokenizer as one GGUF file.",
    )
    sub = parser.add_subparsers(dest="convert_command", metavar="SUBCOMMAND")

    src = sub.add_parser(
        "from-hf", help="HF model folder -> lmforge model folder",
        description="Read a Hugging Face model folder (config.json + model.safetensors, sharded safetensors, or "
        "pytorch_model.bin read with torch.load(weights_only=True)) and write an lmforge model folder "
        "(config.json + model.safetensors + tokenizer). Task heads such as a sequence classifier are kept "
        "beside the body as head.safetensors + head.json.",
    )
    src.add_argument("src", metavar="SRC", help="Hugging Face model folder, or the name of an installed one "
                                                "(all-MiniLM-L6-v2)")
    src.add_argument("dst", metavar="DST", help="lmforge model folder to write")
    src.add_argument("--architecture", metavar="CLASS",
                     help="HF class to read SRC as, e.g. BertModel (default: the first of config.json's architectures)")
    src.add_argument("--dtype", choices=DTYPES, help="cast the weights (default: keep the checkpoint's precision)")
    src.add_argument("--overwrite", action="store_true", help="replace DST if it already exists")
    src.set_defaults(func=run_from_hf)

    dst = sub.add_parser(
        "to-hf", help="lmforge model folder -> HF model folder",
        description="Write an lmforge model folder as a Hugging Face folder that transformers' "
        "AutoModel*.from_pretrained loads offline, with tokenizer.json and tokenizer_config.json for "
        "AutoTokenizer (and the folder's chat_template.json as its Jinja chat_template, for "
        "tokenizer.apply_chat_template). Fails, naming the field, if no supported HF architecture expresses the "
        "config.",
    )
    dst.add_argument("src", metavar="SRC", help="lmforge model folder")
    dst.add_argument("dst", metavar="DST", help="Hugging Face model folder to write")
    dst.add_argument("--dtype", choices=DTYPES, help="cast the weights (default: as stored)")
    dst.add_argument("--overwrite", action="store_true", help="replace DST if it already exists")
    add_load_flags(dst)
    dst.set_defaults(func=run_to_hf)

    gg = sub.add_parser(
        "to-gguf", help="lmforge decoder folder -> one GGUF file for llama.cpp",
        description="Write a GPT-2-, Llama-, Mistral- or Qwen2-shaped decoder and its byte-level BPE tokenizer as "
        "one GGUF file that llama.cpp and llama-cpp-python load. Refuses, in one line and writing nothing, what "
        "llama.cpp cannot run as lmforge does: encoders, Shaw/ALiBi/T5 positions, a quantised folder, a "
        "SentencePiece-style or WordPiece tokenizer, a config field the four families lack.",
    )
    gg.add_argument("src", metavar="MODEL", help="lmforge model folder (or a run folder: its best/, else model/)")
    gg.add_argument("dst", metavar="OUT.gguf", help="GGUF file to write")
    gg.add_argument("--outtype", choices=GGUF_OUTTYPES, default="f32",
                    help="weight type: f32 (default), f16, or q8_0 (2-D weights; norms and biases stay f32)")
    gg.add_argument("--overwrite", action="store_true", help="replace OUT.gguf if it already exists")
    add_load_flags(gg)
    gg.set_defaults(func=run_to_gguf)
    parser.set_defaults(func=lambda args: parser.print_help() or 0)


def _dtype(name: str | None):
    import torch

    return getattr(torch, name) if name else None


def run_from_hf(args) -> int:
    # An installed model's name (all-MiniLM-L6-v2) stands for the Hugging Face folder its package holds.
    conv = convert_from_hf(model_source(args.src), args.dst, architecture=args.architecture, dtype=_dtype(args.dtype),
                           overwrite=args.overwrite)
    for note in conv.notes:
        print(f"note: {note}", file=sys.stderr)
    cfg = conv.model.config
    layers = f"{cfg.n_layers}+{cfg.decoder_layers}" if cfg.arch == "encoder-decoder" else cfg.n_layers
    parts = [f"{conv.architecture} -> {cfg.arch}, {layers} layers, d_model {cfg.d_model}, head {cfg.head}",
             f"{conv.model.num_parameters():,} parameters"]
    parts.append(f"tokenizer {conv.tokenizer.kind}" if conv.tokenizer is not None else "no tokenizer")
    if conv.task_head is not None:
        parts.append(f"task head kept in head.safetensors ({', '.join(conv.task_head.tensors)})")
    print(f"wrote {args.dst}: " + "; ".join(parts))
    return 0


def _chat_jinja(src) -> str | None:
    """The folder's chat template (chat_template.json, from instruction tuning) as Jinja, or None."""
    from pathlib import Path

    from lmforge.prompting.instruct import CHAT_TEMPLATE_FILE, ChatTemplate
    from lmforge.tokenization import Tokenizer

    if not (Path(src) / CHAT_TEMPLATE_FILE).is_file() or not (Path(src) / "tokenizer.json").is_file():
        return None
    return ChatTemplate.load(src).to_jinja(Tokenizer.load(src))


def run_to_hf(args) -> int:
    from pathlib import Path

    require_kind(args.src, ("model", "quantized", "task"), "convert to-hf")  # before anything is read or written
    chat = _chat_jinja(args.src)
    if (Path(args.src) / "task.json").is_file():  # a fine-tuned task folder: its head becomes HF's task class
        from lmforge.interop.hf import to_hf
        from lmforge.tasks.model import load_task_model, to_hf_head

        model = load_task_model(args.src)
        path = to_hf(model.body, args.dst, tokenizer=args.src if (Path(args.src) / "tokenizer.json").is_file() else None,
                     task_head=to_hf_head(model), dtype=_dtype(args.dtype), overwrite=args.overwrite,
                     chat_template=chat)
    else:
        path = convert_to_hf(args.src, args.dst, dtype=_dtype(args.dtype), overwrite=args.overwrite,
                             chat_template=chat)
    hf = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    has_tokenizer = (Path(path) / "tokenizer.json").is_file()
    tokenizer = "tokenizer.json + tokenizer_config.json" if has_tokenizer else "no tokenizer"
    if has_tokenizer and chat is not None:
        tokenizer += " (with the chat template)"
    print(f"wrote {path}: {hf['architectures'][0]} (model_type {hf['model_type']}); {tokenizer}")
    return 0


def run_to_gguf(args) -> int:
    folder = model_argument("convert to-gguf", args.src)
    done = convert_to_gguf(folder, args.dst, outtype=args.outtype, overwrite=args.overwrite,
                           chat_template=_chat_jinja(folder))
    for note in done.notes:
        print(f"note: {note}", file=sys.stderr)
    size = done.path.stat().st_size / 2**20
    print(f"wrote {done.path}: llama.cpp arch {done.arch} (from {done.family}), {done.outtype}, {done.n_tensors} "
          f"tensors, {done.n_tokens} tokens (gpt2 tokenizer), context {done.context_length}; {size:.1f} MiB")
    return 0
