"""Interoperability with other libraries: Hugging Face ``transformers`` checkpoints (:mod:`.hf`).

Example:
    >>> import tempfile, lmforge
    >>> folder = lmforge.to_hf(lmforge.build_model("llama-tiny", n_layers=1), tempfile.mkdtemp() + "/hf")
    >>> model = lmforge.from_hf(folder)  # any HF folder with config.json and weights
    >>> model.config.n_layers
    1
"""

from lmforge.interop.hf import (
    HFConversion,
    HFConversionError,
    TaskHead,
    convert_from_hf,
    convert_to_hf,
    from_hf,
    load_hf,
    to_hf,
)

__all__ = ["HFConversion", "HFConversionError", "TaskHead", "convert_from_hf", "convert_to_hf", "from_hf", "load_hf",
           "to_hf"]
