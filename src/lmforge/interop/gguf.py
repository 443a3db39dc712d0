"""GGUF export: an lmforge decoder and its tokenizer as one file that llama.cpp (llama-cpp-python, ollama,
LM Studio, ...) runs.

    lmforge model --hf_config_for--> HF family --family rules--> HF tensor names --gguf.TensorNameMap--> GGUF names

The Hugging Face family declarations (:mod:`~lmforge.interop.hf_gpt2`, :mod:`~lmforge.interop.hf_llama`) say
which HF config expresses the model exactly and what each tensor is called there; the ``gguf`` package's own
table turns those names into llama.cpp's. What changes on the way:

    HF family   GGUF arch   tensors
    gpt2        gpt2        q, k, v stacked into blk.N.attn_qkv (rows q, then k, then v)
    llama       llama       q/k rows interleaved per head: llama.cpp's llama RoPE rotates adjacent pairs
                            (x0, x1), ours (and HF's) rotates halves (x_i, x_{i+d/2}); the scores are the same
    mistral     llama       as llama; the context length is capped at the sliding window, since llama.cpp's
                            llama has no window (within the window, windowed and full attention agree)
    qwen2       qwen2       unchanged: llama.cpp's qwen2 RoPE rotates halves ("NEOX")

At f32, llama.cpp's logits for the Llama-shaped archs equal lmforge's to ~1e-5; GPT-2's differ by up to ~1e-3,
because ggml's CPU GELU looks the tanh form up in a table indexed by the input rounded to fp16
(tests/test_gguf.py shows the gap shrinks when lmforge does the same). A tied LM head writes no ``output`` tensor
(llama.cpp reads ``token_embd`` for it). Weights are stored as
``--outtype``: f32; f16 (2-D tensors; norms and biases stay f32); or q8_0 (2-D tensors whose rows are a
multiple of 32 wide, the rest f16), as llama.cpp's own converter stores them.

The tokenizer goes inside the file. Only a byte-level BPE (``byte-bpe``: GPT-2's ByteLevel pre-tokenizer, no
normaliser) is written, as llama.cpp's ``gpt2`` tokenizer with the ``gpt-2`` pre-tokenizer: the same regex
split, byte alphabet and merges, so llama.cpp gives lmforge's ids. Refused: SentencePiece-style ``bpe`` and
``unigram`` (lmforge collapses whitespace runs and NFC-normalises first, and llama.cpp's SentencePiece tokenizer
merges by score rather than by rank, so its ids would differ) and ``wordpiece``. BOS is added to a prompt as
:func:`lmforge.generation.generate.encode_prompt` adds it: when the family has a BOS of its own (not GPT's,
which is its EOS). Special tokens are CONTROL tokens: llama.cpp reads their text in a prompt only when asked
to (``tokenize(..., special=True)``), where lmforge always does.

Refused in one line, writing nothing: an encoder or encoder-decoder, a model without an LM head, positions
llama.cpp's gpt2/llama/qwen2 lack (Shaw relative, ALiBi, T5 bias, DeBERTa, sinusoidal, none), any config field
the four HF families cannot express (they name it), an activation the llama.cpp graph does not use, a
quantised model folder (convert its full-precision folder; ``--outtype q8_0`` quantises), a tokenizer of the
kinds above, and an existing OUT without ``overwrite``. The file is written to a temporary sibling and renamed.

Example:
    >>> import tempfile, pathlib, lmforge
    >>> from lmforge.tokenization import train_tokenizer
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.txt").write_text("the cat sat on the mat\\n\\nthe dog sat on the log\\n" * 50)
    >>> tok = train_tokenizer([d / "a.txt"], kind="byte-bpe", vocab_size=300, family="gpt", show_progress=False)
    >>> model = lmforge.build_model("llama-tiny", n_layers=1, vocab_size=tok.vocab_size)
    >>> out = to_gguf(model, d / "tiny.gguf", tokenizer=tok, outtype="q8_0")
    >>> out.arch, out.outtype, out.n_tokens == tok.vocab_size
    ('llama', 'q8_0', True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop.hf import hf_config_for, load_hf
from lmforge.interop.hf_family import Family, HFConversionError, Mapper
from lmforge.model_folder import read_config
from lmforge.models import load_transformer
from lmforge.models.quantize import quantization_of, read_quantization
from lmforge.tokenization import Tokenizer
from lmforge.utils.io import atomic_write_with

OUTTYPES = ("f32", "f16", "q8_0")
GGUF_ARCH = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "qwen2"}
# llama.cpp's graphs fix the activation: gpt2 uses ggml_gelu (the tanh approximation), llama and qwen2 SiLU-gated.
ACTIVATION = {"gpt2": "gelu-tanh", "llama": "swiglu", "qwen2": "swiglu"}
POSITION_NAMES = {"relative": "Shaw relative positions", "alibi": "ALiBi", "t5-bias": "T5 relative bias",
                  "deberta": "DeBERTa's disentangled positions", "sinusoidal": "sinusoidal positions",
                  "none": "no positions"}
Q8_0_BLOCK = 32  # values per q8_0 block: a row must be a whole number of blocks
GPT2_PRE_TOKENIZER = "gpt-2"  # llama.cpp's name for GPT-2's split regex


class GGUFExportError(LmforgeError, ValueError):
    """A model or tokenizer that GGUF (as llama.cpp reads it) cannot express; the message names what."""


@dataclass
class GGUFExport:
    """What :func:`to_gguf` wrote: the file, llama.cpp's architecture, the weight type, and notes."""

    path: Path
    arch: str
    family: str
    outtype: str
    n_tensors: int
    n_tokens: int
    context_length: int
    notes: list[str] = field(default_factory=list)


@dataclass
class GGUFVocab:
    """A tokenizer as GGUF's ``tokenizer.ggml.*`` fields: one token string and type per model id."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    special: dict[str, int]  # bos/eos/unk/pad -> id
    add_bos: bool


# ---------------------------------------------------------------------------------------- the model
def gguf_arch(cfg: ModelConfig) -> tuple[Family, str, int, list[str]]:
    """The HF family, llama.cpp architecture and context length that express ``cfg``, and notes.

    Raises :class:`GGUFExportError` naming the first thing llama.cpp cannot run as lmforge does.

    Example:
        >>> import lmforge
        >>> family, arch, context, notes = gguf_arch(lmforge.build_model("gpt-tiny").config)
        >>> family.model_type, arch, context
        ('gpt2', 'gpt2', 256)
    """
    what = f"model {cfg.name!r}"
    if cfg.arch != "decoder":
        raise GGUFExportError(f"{what} is an {cfg.arch}; GGUF export takes decoders (llama.cpp's gpt2, llama and "
                              "qwen2 architectures)")
    if cfg.head != "lm":
        raise GGUFExportError(f"{what} has head={cfg.head!r}; GGUF export needs a language-model head (head='lm')")
    if cfg.position not in ("learned", "rope"):
        raise GGUFExportError(f"{what} uses {POSITION_NAMES.get(cfg.position, cfg.position)} "
                              f"(position={cfg.position!r}); llama.cpp's gpt2, llama and qwen2 take learned "
                              "positions or RoPE only")
    try:
        family, _, _ = hf_config_for(cfg)
    except HFConversionError as exc:
        raise GGUFExportError(f"GGUF export: {exc}") from None
    arch = GGUF_ARCH.get(family.model_type)
    if arch is None:
        raise GGUFExportError(f"{what} is a {family.model_type} model; GGUF export supports the gpt2, llama, mistral "
                              "and qwen2 families")
    if cfg.activation != ACTIVATION[arch]:
        raise GGUFExportError(f"{what} has activation={cfg.activation!r}; llama.cpp's {arch} computes "
                              f"{ACTIVATION[arch]!r} only")
    if cfg.attn_scale_by_layer:
        raise GGUFExportError(f"{what} has attn_scale_by_layer=True (GPT-2's scale_attn_by_inverse_layer_idx); "
                              "llama.cpp's gpt2 scales every layer's scores by 1/sqrt(head_dim) only")
    if arch == "qwen2" and cfg.n_heads * cfg.dim_per_head != cfg.d_model:
        raise GGUFExportError(f"{what} has n_heads x head_dim = {cfg.n_heads * cfg.dim_per_head} != d_model "
                              f"{cfg.d_model}; llama.cpp's qwen2 needs them equal")
    notes, context = [], cfg.max_seq_len
    if cfg.sliding_window is not None and cfg.sliding_window < context:
        context = cfg.sliding_window
        notes.append(f"context length {context} (the sliding window): llama.cpp's {arch} attends to the whole "
                     f"context, which matches the window only up to {context} tokens")
    return family, arch, context, notes


def _interleave_halves(rows: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder each head's output rows from halves [a_0 .. a_{h-1}, b_0 .. b_{h-1}] to pairs [a_0, b_0, a_1, b_1, ...].

    A q/k projection so reordered, under RoPE on adjacent pairs, gives the scores the original gives under RoPE
    on halves: row i and row i + h are rotated together at frequency i either way, and q.k is a sum over rows.
    """
    head_dim = rows.shape[0] // n_heads
    half = head_dim // 2
    order = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)  # 0, h, 1, h+1, ...
    index = (torch.arange(n_heads)[:, None] * head_dim + order).reshape(-1)  # (n_heads * head_dim,)
    return rows.index_select(0, index)


def gguf_tensors(model, family: Family, arch: str) -> dict[str, torch.Tensor]:
    """The model's tensors under llama.cpp's names (fp32, in ``nn.Linear``'s (out, in) layout, which GGUF stores
    as ggml's (in, out))."""
    import gguf

    cfg = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.n_layers)
    mapper = Mapper(family.rules(cfg))
    grouped: dict[str, dict[int, torch.Tensor]] = {}
    for key, tensor in model.state_dict().items():
        rule, theirs = mapper(key)
        hf_name = theirs if rule.top_level else family.prefix + theirs
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise GGUFExportError(f"lmforge tensor {key!r} (Hugging Face {hf_name!r}) has no name in llama.cpp's "
                                  f"{arch}")
        tensor = tensor.detach().to("cpu", torch.float32)
        if arch == "llama" and ".attn.q." in key:
            tensor = _interleave_halves(tensor, cfg.n_heads)
        elif arch == "llama" and ".attn.k." in key:
            tensor = _interleave_halves(tensor, cfg.kv_heads)
        # GPT-2's fused c_attn: q, k and v are row blocks of one projection in both layouts.
        grouped.setdefault(name, {})[rule.part[0] if rule.part else 0] = tensor
    return {name: torch.cat([parts[k] for k in sorted(parts)]).contiguous() for name, parts in grouped.items()}


def _encoded(name: str, tensor: torch.Tensor, outtype: str, notes: list[str]):
    """(array, ggml type or None for the array's own) of one tensor stored as ``outtype``."""
    import gguf
    import numpy as np

    array = tensor.numpy()
    if outtype == "f32" or array.ndim == 1:  # norms and biases stay f32, as llama.cpp's converter keeps them
        return array, None
    if outtype == "q8_0" and array.shape[-1] % Q8_0_BLOCK == 0:
        qtype = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(array, qtype), qtype
    if outtype == "q8_0":
        notes.append(f"{name} kept in f16: its rows ({array.shape[-1]} wide) are not whole q8_0 blocks of "
                     f"{Q8_0_BLOCK}")
    half = array.astype(np.float16)
    if not np.isfinite(half).all():
        raise GGUFExportError(f"tensor {name} has values beyond float16's range (|x| > 65504); use --outtype f32")
    return half, None


# ---------------------------------------------------------------------------------------- the tokenizer
def _require(value: Any, wanted: Any, what: str) -> None:
    if value != wanted:
        raise GGUFExportError(f"tokenizer {what} is {value!r}; GGUF's gpt2 tokenizer needs {wanted!r} (GPT-2's "
                              "byte-level BPE)")


def gguf_vocab(tokenizer: Tokenizer, vocab_size: int) -> GGUFVocab:
    """``tokenizer`` as GGUF tokenizer fields for a model of ``vocab_size`` ids (ids the tokenizer lacks become
    unused ``[PAD<id>]`` tokens).

    Raises :class:`GGUFExportError` for a tokenizer llama.cpp would tokenize differently (see the module docstring).
    """
    import gguf

    if tokenizer.kind != "byte-bpe":
        reason = {"bpe": "SentencePiece-style BPE: lmforge collapses whitespace and NFC-normalises first, and "
                         "llama.cpp's SentencePiece tokenizer merges by score, not by rank",
                  "unigram": "Unigram: lmforge collapses whitespace and NFC-normalises first, which llama.cpp's "
                             "tokenizers do not",
                  "wordpiece": "WordPiece: a BERT vocabulary, not a decoder's"}.get(tokenizer.kind,
                                                                                   "not byte-level BPE")
        raise GGUFExportError(f"tokenizer kind {tokenizer.kind!r} cannot be written into GGUF so that llama.cpp gives "
                              f"the same ids ({reason}); train a byte-bpe tokenizer")
    spec = json.loads(tokenizer.backend.to_str())
    _require(spec.get("normalizer"), None, "normalizer")
    pre = spec.get("pre_tokenizer") or {}
    _require(pre.get("type"), "ByteLevel", "pre_tokenizer")
    _require(pre.get("use_regex", True), True, "pre_tokenizer ByteLevel use_regex")
    _require(pre.get("add_prefix_space", False), False, "pre_tokenizer ByteLevel add_prefix_space")
    model = spec["model"]
    _require(model.get("type"), "BPE", "model")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        _require(model.get(key) or None, None, f"BPE {key}")
    for key in ("byte_fallback", "ignore_merges"):
        _require(bool(model.get(key)), False, f"BPE {key}")
    if tokenizer.vocab_size > vocab_size:
        raise GGUFExportError(f"the tokenizer has {tokenizer.vocab_size} ids but the model only {vocab_size}")

    tokens: list[str | None] = [None] * vocab_size
    types = [int(gguf.TokenType.NORMAL)] * vocab_size
    for token, idx in model["vocab"].items():
        tokens[idx] = token
    for added in spec.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        types[added["id"]] = int(gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED)
    for idx, token in enumerate(tokens):
        if token is None:  # llama.cpp wants one token per row of the embedding
            tokens[idx], types[idx] = f"[PAD{idx}]", int(gguf.TokenType.UNUSED)
    # Byte-level tokens hold no literal space (it is "Ġ"), so "a b" splits back into its pair unambiguously.
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    ids = tokenizer.special_token_ids()
    special = {role: ids[f"{role}_token_id"] for role in ("bos", "eos", "unk", "pad") if f"{role}_token_id" in ids}
    bos, eos = special.get("bos"), special.get("eos")
    return GGUFVocab(tokens, types, merges, special, add_bos=bos is not None and bos != eos)


# ---------------------------------------------------------------------------------------- writing
def to_gguf(model, path: str | Path, *, tokenizer: Tokenizer, outtype: str = "f32", overwrite: bool = True,
            chat_template: str | None = None) -> GGUFExport:
    """Write an lmforge decoder and its tokenizer as one GGUF file for llama.cpp.

    Args:
        model: an lmforge Transformer (a GPT-2-, Llama-, Mistral- or Qwen2-shaped decoder with an LM head).
        path: the ``.gguf`` file to write (atomically: a temporary sibling, then a rename).
        tokenizer: the model's byte-level BPE tokenizer; it is written inside the file.
        outtype: ``"f32"``, ``"f16"`` or ``"q8_0"``.
        overwrite: replace an existing file.
        chat_template: a Jinja chat template (as HF's ``tokenizer_config.json`` holds it), stored as
            ``tokenizer.chat_template``.

    Returns:
        :class:`GGUFExport`; nothing is written when the model or tokenizer is refused.

    Example: see the module docstring.
    """
    try:
        import gguf
    except ImportError:
        raise GGUFExportError("writing GGUF needs the gguf package: pip install 'lmforge[gguf]'") from None
    if outtype not in OUTTYPES:
        raise GGUFExportError(f"outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    path = Path(path)
    if path.is_dir():
        raise GGUFExportError(f"{path}: is a folder; give the .gguf file to write")
    if path.exists() and not overwrite:
        raise GGUFExportError(f"{path}: already exists (use --overwrite / overwrite=True to replace it)")
    if quantization_of(model) is not None:
        raise GGUFExportError(f"model {model.config.name!r} is {quantization_of(model)['mode']}-quantised; convert "
                              "its full-precision folder (--outtype q8_0 quantises in GGUF's own format)")
    cfg = model.config
    family, arch, context, notes = gguf_arch(cfg)
    vocab = gguf_vocab(tokenizer, cfg.vocab_size)
    tensors = {name: _encoded(name, t, outtype, notes) for name, t in gguf_tensors(model, family, arch).items()}

    def write(tmp: str) -> None:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(cfg.name)
        w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                         "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype])
        if outtype == "q8_0":
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_context_length(context)
        w.add_embedding_length(cfg.d_model)
        w.add_feed_forward_length(cfg.d_ff)
        w.add_block_count(cfg.n_layers)
        w.add_head_count(cfg.n_heads)
        w.add_head_count_kv(cfg.kv_heads)
        if arch == "gpt2":
            w.add_layer_norm_eps(cfg.layer_norm_eps)
        else:
            w.add_layer_norm_rms_eps(cfg.layer_norm_eps)
            w.add_rope_freq_base(cfg.rope_theta)
            w.add_rope_dimension_count(cfg.dim_per_head)
            w.add_key_length(cfg.dim_per_head)
            w.add_value_length(cfg.dim_per_head)
            w.add_vocab_size(cfg.vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(GPT2_PRE_TOKENIZER)
        w.add_token_list(vocab.tokens)
        w.add_token_types(vocab.types)
        w.add_token_merges(vocab.merges)
        for role, idx in vocab.special.items():
            getattr(w, f"add_{role}_token_id")(idx)
        w.add_add_bos_token(vocab.add_bos)
        w.add_add_eos_token(False)  # a decoder prompt ends open (encode_prompt adds no EOS)
        if chat_template is not None:
            w.add_chat_template(chat_template)
        for name, (array, qtype) in tensors.items():
            w.add_tensor(name, array, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    atomic_write_with(path, write)
    return GGUFExport(path, arch, family.model_type, outtype, len(tensors), len(vocab.tokens), context, notes)


def convert_to_gguf(source: str | Path, dst: str | Path, *, outtype: str = "f32", overwrite: bool = False,
                    chat_template: str | None = None) -> GGUFExport:
    """lmforge model folder (or a Hugging Face folder of the same families) -> one GGUF file with its tokenizer.

    The folder's config is checked before its weights are read; on any refusal ``dst`` is left as it was.
    """
    source = Path(source)
    if not (source / "config.json").is_file():
        raise GGUFExportError(f"{source}: not a model folder (no config.json)")
    record = read_quantization(source)
    if record is not None:
        raise GGUFExportError(f"{source}: a {record['mode']}-quantised model folder cannot be carried into GGUF; "
                              "convert the full-precision folder (--outtype q8_0 quantises in GGUF's own format)")
    dst = Path(dst)
    if dst.exists() and not overwrite:  # before the weights are read
        raise GGUFExportError(f"{dst}: already exists (use --overwrite to replace it)")
    if '"model_type"' in (source / "config.json").read_text(encoding="utf-8"):
        conv = load_hf(source)
        model, tokenizer = conv.model, conv.tokenizer
    else:
        gguf_arch(read_config(source))
        model = load_transformer(source)
        tokenizer = Tokenizer.load(source) if (source / "tokenizer.json").is_file() else None
    if tokenizer is None:
        raise GGUFExportError(f"{source}: no tokenizer.json; a GGUF file carries its tokenizer, so save the model "
                              "with one")
    return to_gguf(model.eval(), dst, tokenizer=tokenizer, outtype=outtype, overwrite=overwrite,
                   chat_template=chat_template)
