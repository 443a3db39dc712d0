"""Interoperability with other libraries: Hugging Face ``transformers`` checkpoints (:mod:`.hf`).

Example:
    >>> import lmforge
    >>> model = lmforge.from_hf("path/to/hf-folder")  # doctest: +SKIP
    >>> lmforge.to_hf(model, "path/to/out")  # doctest: +SKIP
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
