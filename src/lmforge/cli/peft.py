"""``lmforge peft``: inspect adapters, merge them into a plain model, export them for HF peft.

Example::

    $ lmforge peft info runs/lora/adapter
    $ lmforge peft merge --base gpt/ --adapter runs/lora/adapter --out gpt-merged/
    $ lmforge convert to-hf gpt/ gpt-hf/
    $ lmforge peft export-hf --base gpt/ --adapter runs/lora/adapter --out lora-hf/
      # then: peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("gpt-hf"), "lora-hf")

Errors (not an adapter folder, an adapter trained on another base, a method that cannot be merged or
exported) are one line on stderr with exit code 2, and OUT is left untouched.
"""

from __future__ import annotations

import json
from pathlib import Path

from lmforge.checkpoint import load, save
from lmforge.cli._load_args import add_load_flags
from lmforge.cli.main import UserError, require_path
from lmforge.errors import LmforgeError
from lmforge.peft import load_adapter, read_adapter_config
from lmforge.peft.hf_export import export_hf
from lmforge.tasks.model import read_task_meta
from lmforge.tasks.peft import merge_task_folder
from lmforge.tokenization import Tokenizer
from lmforge.utils.folder_kinds import adapter_kinds, require_kind


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "peft", help="parameter-efficient fine-tuning adapters: info, merge, export-hf",
        description="Work with PEFT adapter folders (adapter_config.json + adapter.safetensors) written by "
        "lmforge: LoRA, QLoRA, Houlsby adapters, prefix and prompt tuning, (IA)^3, BitFit and MAM.",
    )
    sub = parser.add_subparsers(dest="peft_command", metavar="SUBCOMMAND")

    info = sub.add_parser("info", help="method, options, size and base model of an adapter",
                          description="Print an adapter's method and options, its parameter count and the "
                          "base model it was trained on (name, architecture hash, weight checksum).")
    info.add_argument("adapter", metavar="ADAPTER", help="adapter folder")
    info.add_argument("--json", action="store_true", help="print the whole adapter_config.json as one JSON line")
    info.set_defaults(func=run_info)

    merge = sub.add_parser(
        "merge", help="write a plain model folder with a LoRA / QLoRA / (IA)^3 / BitFit adapter merged in",
        description="Load the base model folder, attach the adapter (checking that it was trained on this base), "
        "fold it into the weights and write a plain lmforge model folder that lmforge.load reads without "
        "lmforge.peft. QLoRA adapters are merged into the dequantised NF4 weights they were trained against.",
    )
    _common(merge, "lmforge model folder to write")
    merge.set_defaults(func=run_merge)

    export = sub.add_parser(
        "export-hf", help="write the adapter in HF peft format (adapter_config.json + adapter_model.safetensors)",
        description="Write the adapter as an HF peft folder that peft.PeftModel.from_pretrained loads onto the "
        "`lmforge convert to-hf` export of the base model. Supported: LoRA and QLoRA (any family), (IA)^3, and "
        "prefix and prompt tuning on decoder-only models.",
    )
    _common(export, "HF peft adapter folder to write")
    export.add_argument("--base-name", metavar="NAME",
                        help="base_model_name_or_path to record (default: the base folder's path)")
    export.set_defaults(func=run_export_hf)
    parser.set_defaults(func=lambda args: parser.print_help() or 0)


def _common(parser, out_help: str) -> None:
    parser.add_argument("--base", required=True, metavar="DIR", help="lmforge model folder the adapter was trained on")
    parser.add_argument("--adapter", required=True, metavar="DIR", help="adapter folder")
    parser.add_argument("--out", required=True, metavar="DIR", help=out_help)
    parser.add_argument("--no-check-base", action="store_true",
                        help="skip the base weight checksum (the architecture is always checked)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it already exists")
    add_load_flags(parser)


def _load(args, verb: str):
    require_kind(args.base, ("model", "hf"), verb, "--base")
    require_kind(args.adapter, adapter_kinds(args.adapter), verb, "--adapter")
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise UserError(f"{out}: already exists (use --overwrite to replace it)")
    base = Path(args.base)
    if not (base / "config.json").is_file():
        raise UserError(f"{base}: not an lmforge model folder (no config.json)")
    return load_adapter(load(base), require_path(args.adapter, "--adapter", folder=True),
                        check_base=not args.no_check_base)


def run_info(args) -> int:
    require_kind(args.adapter, adapter_kinds(args.adapter), "peft info")
    meta, cfg = read_adapter_config(require_path(args.adapter, "ADAPTER", folder=True))
    if args.json:
        print(json.dumps(meta))
        return 0
    base = meta.get("base", {})
    rows = {
        "adapter": f"{meta.get('name')} ({args.adapter})",
        "method": cfg.method,
        "options": ", ".join(f"{k}={v}" for k, v in cfg.options().items() if k != "method") or "defaults",
        "parameters": f"{meta.get('parameters', 0):,}",
        "base": f"{base.get('name')} ({base.get('parameters', 0):,} parameters)",
        "base config": str(base.get("config_sha256", ""))[:16],
        "base weights": str(base.get("weights_sha256", ""))[:16],
        "mergeable": "yes" if cfg.mergeable else "no",
    }
    width = max(map(len, rows))
    for key, value in rows.items():
        print(f"{key:<{width}}  {value}")
    return 0


def run_merge(args) -> int:
    adapter = Path(args.adapter)
    require_kind(adapter, ("adapter", "task"), "peft merge", "--adapter")  # a task folder: finetune --peft's
    if adapter.is_dir() and (read_task_meta(adapter) or {}).get("peft"):
        return _merge_task_folder(args, adapter)
    model = _load(args, "peft merge")
    name = model.active_adapter
    try:
        merged = model.merge_and_unload(name)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    tokenizer = None
    if (Path(args.base) / "tokenizer.json").is_file():
        tokenizer = Tokenizer.load(args.base)
    save(merged.eval(), args.out, tokenizer=tokenizer)
    print(f"wrote {args.out}: {merged.config.name} with adapter {name!r} ({model.peft_configs[name].method}) merged; "
          f"{merged.num_parameters():,} parameters")
    return 0


def _merge_task_folder(args, adapter: Path) -> int:
    """A task's adapter (``finetune --peft`` of a head task) belongs with its head: write a plain task folder."""
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise UserError(f"{out}: already exists (use --overwrite to replace it)")
    try:
        merge_task_folder(adapter, out, base=require_path(args.base, "--base", folder=True),
                          check_base=not args.no_check_base)
    except LmforgeError:
        raise
    except ValueError as exc:  # a method that does not fold into the weights
        raise UserError(str(exc)) from exc
    print(f"wrote {out}: task folder {adapter} with its adapter merged into the base {args.base}")
    return 0


def run_export_hf(args) -> int:
    model = _load(args, "peft export-hf")
    path = export_hf(model, args.out, base_model_name_or_path=args.base_name or str(args.base))
    hf = json.loads((Path(path) / "adapter_config.json").read_text(encoding="utf-8"))
    print(f"wrote {path}: {hf['peft_type']} for {hf.get('task_type') or 'the base model'}; load it with "
          f"peft.PeftModel.from_pretrained(<`lmforge convert to-hf {args.base}` model>, {str(path)!r})")
    return 0
