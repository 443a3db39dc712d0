"""What the manifest check costs when a model folder is loaded: ``lmforge.load(path)`` with and without it.

Saves a randomly initialised model (``gpt2``, 124M parameters, fp32: ~500 MB of safetensors) to a temporary
folder, then times ``lmforge.load(path, verify=True)`` (sizes and sha256 of every file checked against
``manifest.json``) against ``verify=False`` (``--no-verify``), interleaved (a, b; b, a; ...) after one warm-up
each, so both read the files from the page cache and a busy machine slows both alike. Both include what every
load does: reading the tensors, checking their shapes and that they are finite. The hash alone
(:func:`lmforge.model_folder.verify_folder`) is timed in the same rounds.

Usage:
    python benchmarks/verify_cost.py             # gpt2, 5 repeats
    python benchmarks/verify_cost.py --quick     # gpt-tiny, 3 repeats

Output: one line per variant (median seconds), the ratio, then one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python benchmarks/verify_cost.py): the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import machine_info, time_steps  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2", help="model preset to save and load (default gpt2, 124M)")
    parser.add_argument("--repeats", type=int, default=5, help="timed loads per variant (median reported)")
    parser.add_argument("--quick", action="store_true", help="gpt-tiny, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.preset, args.repeats = "gpt-tiny", 3

    import lmforge
    from lmforge.model_folder import verify_folder

    with tempfile.TemporaryDirectory() as tmp:
        model = lmforge.build_model(args.preset)
        params = model.num_parameters()
        path = model.save(Path(tmp) / "model")
        del model
        size = sum(p.stat().st_size for p in path.iterdir())
        steps = [lambda: lmforge.load(path, verify=True), lambda: lmforge.load(path, verify=False),
                 lambda: verify_folder(path, verify=True)]
        (checked, _), (unchecked, _), (hashing, _) = time_steps(steps, warmup=1, repeats=args.repeats, rotate=True)
    ratio = checked / unchecked
    print(f"{args.preset} ({params / 1e6:.0f}M parameters, {size / 1e6:.0f} MB folder), median of {args.repeats}:")
    print(f"  load, verified (default)   {checked:.3f} s")
    print(f"  load, --no-verify          {unchecked:.3f} s")
    print(f"  manifest check alone       {hashing:.3f} s ({size / 1e6 / hashing:.0f} MB/s)")
    print(f"  verified / unverified      {ratio:.2f}x (+{checked - unchecked:.3f} s)")
    print(json.dumps({"benchmark": "verify_cost", "preset": args.preset, "parameters": params, "folder_bytes": size,
                      "repeats": args.repeats, "load_verified_s": round(checked, 4),
                      "load_unverified_s": round(unchecked, 4), "verify_only_s": round(hashing, 4),
                      "ratio": round(ratio, 3), "machine": machine_info(peak=False)}))


if __name__ == "__main__":
    main()
