"""Export float16 copies of the corpus's transformers as `model.half()` writes them (issue 32: fp16
copies must fuse what their float32 copies fuse).

Runs inside the corpus virtualenv, like export.py, whose model definitions, perturbation and
TorchScript exporter it reuses: each transformer SPEC is built eager, perturbed, made half, and
exported at opset 14 and 17 as NAME-FORM-fp16.onnx beside its float32 copies. Every export is run
in onnxruntime at batch 3 (sequence 13) and compared with PyTorch's float16 output.

    .venv-corpus/bin/python benchmarks/corpus/fp16.py [--out DIR] [--only bert-base,gpt2] [--force]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import warnings
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export  # noqa: E402  (the corpus's own definitions, beside this file)

FORMS = ("opset14", "opset17")
CHECK_REL_TOL = 2e-2  # float16 through 12 layers: a wrong conversion is off by far more


def halved(feeds: dict) -> tuple:
    return tuple(v.half() if v.is_floating_point() else v for v in feeds.values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=export.DEFAULT_OUT)
    parser.add_argument("--only", default="")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    import numpy as np
    import onnxruntime as ort
    import torch

    names = [n for n in args.only.split(",") if n]
    specs = [s for s in export.SPECS if s.library == "transformers" and (not names or s.name in names)]
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for spec in specs:
        seed = zlib.crc32(spec.name.encode())
        torch.manual_seed(seed)
        model = spec.build("eager").eval()
        export.perturb(model, spec, torch.Generator().manual_seed(seed))
        model.half()
        for form in FORMS:
            path = args.out / f"{spec.name}-{form}-fp16.onnx"
            if path.exists() and not args.force:
                print(f"{path.name}: exists, kept", flush=True)
                continue
            trace = halved(spec.inputs(export.TRACE_BATCH, export.TRACE_SEQ, torch.Generator().manual_seed(1)))
            tmp = path.with_name(path.name + ".partial")
            try:
                with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                    warnings.simplefilter("ignore")
                    export.export_torchscript(model, spec, trace, tmp, 17 if form == "opset17" else 14)
                feeds = spec.inputs(export.CHECK_BATCH, export.CHECK_SEQ, torch.Generator().manual_seed(2))
                with torch.no_grad():
                    ref = model(*halved(feeds)).float().numpy()
                options = ort.SessionOptions()
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                session = ort.InferenceSession(str(tmp), options, providers=["CPUExecutionProvider"])
                got = session.run(None, {k: (v.half() if v.is_floating_point() else v).numpy()
                                         for k, v in feeds.items()})[0].astype(np.float32)
                diff, scale = float(np.max(np.abs(got - ref))), float(np.max(np.abs(ref)))
                ok = bool(np.isfinite(got).all()) and diff <= CHECK_REL_TOL * max(scale, 1e-3)
                tmp.replace(path)
                print(f"{path.name}: max |ort - torch| {diff:.2e} (output max "
                      f"{scale:.2e}){'' if ok else ' CHECK FAILED'}",
                      flush=True)
                failed += not ok
            except Exception as error:  # noqa: BLE001 - said, then the next form
                tmp.unlink(missing_ok=True)
                print(f"{path.name}: FAILED: {type(error).__name__}: {str(error)[:500]}", flush=True)
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
