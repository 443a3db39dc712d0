"""Parameter-efficient fine-tuning: each method in its own file, composed with the model by wrapping
modules or hooking its stacks (the model code never learns about PEFT).

    lora.py     LoRA (Hu et al. 2021)             qlora.py   QLoRA, NF4 base (Dettmers et al. 2023)
    adapter.py  Houlsby adapters (2019)           prefix.py  prefix tuning (Li & Liang 2021)
    prompt.py   prompt tuning (Lester et al. 2021) ia3.py    (IA)^3 (Liu et al. 2022)
    bitfit.py   BitFit (Ben Zaken et al. 2022)    mam.py     MAM adapter (He et al. 2022)
    model.py    PeftModel: named adapters, switching, mixed-adapter batches, merging, parameter report
    io.py       adapter folders and base-model identity     hf_export.py  HF peft format
    layer.py    the wrapper every module-level method uses  nf4.py     NF4Linear, the quantised base of QLoRA
    method.py   what a method says about itself             registry.py   the methods, and the tables built from them

Trainer API::

    model = apply_peft(model, PeftConfig(method="lora", r=8, alpha=16, targets=["q", "v"]))
    optimizer = AdamW(p for p in model.parameters() if p.requires_grad)
    out = model(**batch)                                   # the base model's forward contract
    state = peft_state_dict(model)                          # checkpoint: adapter tensors only
    load_peft_state_dict(model, state)                      # resume
    model.save_adapter(out_dir)                             # adapter_config.json + adapter.safetensors
    model = load_adapter(lmforge.load(base_dir), out_dir)   # checks it is the same base

Example:
    >>> import lmforge
    >>> model = apply_peft(lmforge.build_model("gpt-tiny", n_layers=2), PeftConfig(method="lora", r=4))
    >>> print(model.parameter_report())
    trainable params: 12,288 || all params: 6,806,016 || trainable%: 0.1805
"""

from __future__ import annotations

from lmforge.peft.config import PeftConfig
from lmforge.peft.io import AdapterMismatchError, read_adapter_config, save_adapter
from lmforge.peft.model import (ParameterReport, PeftModel, apply_peft, load_adapter, load_peft_state_dict,
                                peft_state_dict)
from lmforge.peft.registry import METHODS

__all__ = [
    "METHODS", "AdapterMismatchError", "ParameterReport", "PeftConfig", "PeftModel", "apply_peft",
    "load_adapter", "load_peft_state_dict", "peft_state_dict", "read_adapter_config", "save_adapter",
]
