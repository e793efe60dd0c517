"""Quantized copies of float models, for benchmarks/quantized_bench.py (issue 32, item 4).

Each float model becomes, through onnxruntime.quantization (the pinned onnxruntime-gpu's own):

- `qdq-pc`: quant_pre_process, then quantize_static(QuantFormat.QDQ, per_channel=True): uint8
  activations, int8 weights;
- `qdq-pt`: the same with per_channel=False (one scale per weight tensor);
- `qdq-bn`: quant_pre_process(skip_optimization=True), then as qdq-pc: onnxruntime's basic
  optimizer, which the pre-processing runs, folds BatchNormalization into Conv; a user who skips it
  keeps BatchNormalization between the Q/DQ pairs (made only where the model has one);
- `dynamic`: quant_pre_process, then quantize_dynamic (int8 weights; activations quantized at run
  time).

The pre-processing (symbolic shape inference, onnxruntime's basic optimizer, onnx shape
inference) is what the quantization documentation asks for before quantizing. Calibration reads
four seeded random batches of the model's own inputs at the dims the manifest gives.

Sources: the bundled sample_models/*.onnx, two float builders from tests/ (a BERT-like and a
ViT-like attention layer), and the models --corpus-models names in --corpus (default: a ResNet, a
BERT and a ViT from benchmarks/corpus/models, the opset-17 exports of `make bench-corpus`; those
absent are skipped). Writes NAME.FORM.onnx and manifest.json (name, source, form, dims) to --out.

    .venv/bin/python benchmarks/corpus/quantized.py --out build/quantized-models
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,  # noqa: E402
                                      quantize_dynamic, quantize_static)
from onnxruntime.quantization.shape_inference import quant_pre_process  # noqa: E402

from fuse_cli.core.feeds import random_inputs  # noqa: E402
from fuse_cli.core.sessions import make_session  # noqa: E402

CALIBRATION_BATCHES = 4
# dims at which a model is calibrated and later benchmarked: small enough for two shared cores
SAMPLE_DIMS = {"batch": 4, "sequence": 64}
CORPUS_DIMS = {"batch": 1, "sequence": 128}
CORPUS_MODELS = "resnet50-opset17,bert-base-opset17,vit-base-opset17"


class RandomBatches(CalibrationDataReader):
    """Seeded random inputs for a model, one batch per seed."""

    def __init__(self, path: Path, dims: dict[str, int]) -> None:
        session = make_session(str(path))
        self._batches = iter([random_inputs(session, dims=dims, seed=seed) for seed in range(CALIBRATION_BATCHES)])

    def get_next(self):
        return next(self._batches, None)


def float_sources(corpus: Path | None, corpus_models: set[str],
                  scratch: Path) -> list[tuple[str, Path, dict[str, int]]]:
    """(name, path, dims) of every float model to quantize."""
    from tests.attention_graphs import bert, vit

    sources = [(p.stem, p, SAMPLE_DIMS) for p in sorted((REPO / "sample_models").glob("*.onnx"))]
    for name, model in (("test-bert-layer", bert(17, padding=False)), ("test-vit-layer", vit(17))):
        path = scratch / f"{name}.onnx"
        model.ir_version = min(model.ir_version, 10)
        onnx.save(model, path)
        sources.append((name, path, SAMPLE_DIMS))
    if corpus is not None and corpus.is_dir():
        sources += [(p.stem, p, CORPUS_DIMS) for p in sorted(corpus.glob("*.onnx")) if p.stem in corpus_models]
    return sources


def has_batch_norm(path: Path) -> bool:
    return any(n.op_type == "BatchNormalization" for n in onnx.load(path, load_external_data=False).graph.node)


# quant_pre_process's own remedies, in the order its documentation offers them, for a model whose
# symbolic shape inference stops ("Incomplete symbolic shape inference": a BERT export here)
PRE_PROCESS_TRIES = ({}, {"auto_merge": True}, {"skip_symbolic_shape": True})


def pre_process(source: Path, destination: Path, **options) -> str:
    """quant_pre_process with the first of PRE_PROCESS_TRIES that works; says which."""
    for extra in PRE_PROCESS_TRIES:
        try:
            quant_pre_process(str(source), str(destination), **options, **extra)
            return ", ".join(f"{k}={v}" for k, v in extra.items()) or "default"
        except Exception as exc:  # onnxruntime's symbolic inference raises a bare Exception
            failure = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    raise RuntimeError(f"quant_pre_process failed every way: {failure}")


def quantize(name: str, source: Path, dims: dict[str, int], out: Path, scratch: Path) -> list[dict]:
    prepared, unoptimized = scratch / f"{name}.pre.onnx", scratch / f"{name}.pre-noopt.onnx"
    pre = pre_process(source, prepared)
    made = []

    def record(form: str, make) -> None:
        path = out / f"{name}.{form}.onnx"
        try:
            make(path)
            made.append({"name": f"{name}.{form}", "source": str(source), "form": form, "dims": dims,
                         "file": path.name, "pre_process": pre})
            print(f"{path.name}: {len(onnx.load(path, load_external_data=False).graph.node)} nodes", flush=True)
        except Exception as exc:  # one model the quantizer refuses is a line in the log, not the end of the corpus
            print(f"{path.name}: skipped, {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)

    def static(model: Path, per_channel: bool):
        return lambda path: quantize_static(str(model), str(path), RandomBatches(model, dims),
                                            quant_format=QuantFormat.QDQ, per_channel=per_channel,
                                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)

    record("qdq-pc", static(prepared, True))
    record("qdq-pt", static(prepared, False))
    if has_batch_norm(source):
        pre_process(source, unoptimized, skip_optimization=True)
        record("qdq-bn", static(unoptimized, True))
    record("dynamic", lambda path: quantize_dynamic(str(prepared), str(path), weight_type=QuantType.QInt8))
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "quantized-models")
    parser.add_argument("--corpus", type=Path, default=REPO / "benchmarks" / "corpus" / "models")
    parser.add_argument("--corpus-models", default=CORPUS_MODELS, help="comma-separated model names in --corpus")
    parser.add_argument("--only", default="",
                        help="comma-separated source names to (re)make; the manifest keeps the rest")
    args = parser.parse_args()
    args.out, args.corpus = args.out.resolve(), args.corpus.resolve()  # the work below runs in a scratch folder
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = {n for n in args.only.split(",") if n}
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if wanted and manifest_path.exists() else []
    manifest = [e for e in manifest if e["name"].rsplit(".", 1)[0] not in wanted]
    # quant_pre_process and the calibrator write scratch files to the working directory
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        for name, path, dims in float_sources(args.corpus, set(args.corpus_models.split(",")), Path(tmp)):
            if not wanted or name in wanted:
                manifest += quantize(name, path, dims, args.out, Path(tmp))
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(manifest)} quantized models in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
