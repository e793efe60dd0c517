"""Pack onnxruntime-gpu's wheel small enough to travel to the GPU machine (at most 64 MiB a call).

    python3 scripts/pack_cuda_runtime.py WHEEL OUT.tar.xz [--arch 90]

The wheel (onnxruntime-gpu 1.31.1, cp312 manylinux x86_64) is 256 MB; its CUDA provider library
alone is 284 MB, 218 MB of it GPU code (`.nv_fatbin`) for sm_75, 80, 86, 89, 90 and 120. A GPU
loads only the machine code built for its own major architecture (there is no PTX in this build to
compile for another), so on an H100 or H200 (sm_90) every other architecture's code is dead weight:
this script overwrites those payloads with zeros, which keeps every offset in the library valid and
compresses to nothing. It also leaves out what fuse never loads: the C API library (the Python
module has the runtime linked in; it needs no libonnxruntime.so), the TensorRT provider, and the
`transformers`, `quantization` and `datasets` Python packages. Measured for 1.31.1 and sm_90:
about 59 MB as xz (the CUDA provider 51 MB, the Python module 8 MB).

On the GPU machine: `python3 -m tarfile -e OUT.tar.xz /tmp/site` and put /tmp/site first on
PYTHONPATH. The result runs on sm_90 devices only; on any other it fails to launch kernels.
"""

from __future__ import annotations

import argparse
import io
import lzma
import struct
import sys
import tarfile
import zipfile
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
# fatbin container header: magic u32, version u16, header size u16, payload size u64
CONTAINER = struct.Struct("<IHHQ")
# an entry's header starts: kind u16, version u16, header size u32, payload size u64; its
# architecture (the sm number) is the u32 at byte 28
ENTRY = struct.Struct("<HHIQ")
ENTRY_ARCH_OFFSET = 28

LEFT_OUT = ("onnxruntime/capi/libonnxruntime.so", "onnxruntime/capi/libonnxruntime_providers_tensorrt.so",
            "onnxruntime/transformers/", "onnxruntime/quantization/", "onnxruntime/datasets/")
CUDA_PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
# x86 branch filter + the largest preset: 1-2% smaller than `xz -9` on these libraries
XZ_FILTERS = [{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


def elf_section(data: bytes | bytearray, name: str) -> tuple[int, int] | None:
    """(file offset, size) of a named section of a 64-bit little-endian ELF file, None if absent."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    section_offset, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple[int, int, int]:
        base = section_offset + i * entry_size
        name_at, = struct.unpack_from("<I", data, base)
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name_at, offset, size

    _, names_at, _ = header(names_index)
    for i in range(count):
        name_at, offset, size = header(i)
        end = data.index(b"\0", names_at + name_at)
        if data[names_at + name_at:end].decode() == name:
            return offset, size
    return None


def keep_only_arch(data: bytearray, start: int, size: int, keep: frozenset[int]) -> dict[int, int]:
    """Zeroes every fatbin entry's payload in data[start:start+size] whose architecture is not in
    `keep`; returns the bytes zeroed per architecture. Containers are 8-byte aligned, with padding
    between them."""
    zeroed: dict[int, int] = {}
    pos, end = start, start + size
    while pos + CONTAINER.size <= end:
        magic, _, header_size, payload_size = CONTAINER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8
            continue
        entry, container_end = pos + header_size, pos + header_size + payload_size
        while entry < container_end:
            _, _, entry_header, entry_payload = ENTRY.unpack_from(data, entry)
            arch, = struct.unpack_from("<I", data, entry + ENTRY_ARCH_OFFSET)
            if arch not in keep:
                body = entry + entry_header
                data[body:body + entry_payload] = bytes(entry_payload)
                zeroed[arch] = zeroed.get(arch, 0) + entry_payload
            entry += entry_header + entry_payload
        pos = container_end
    return zeroed


def pack(wheel: Path, out: Path, keep: frozenset[int]) -> dict[int, int]:
    zeroed: dict[int, int] = {}
    with zipfile.ZipFile(wheel) as source, lzma.open(out, "wb", format=lzma.FORMAT_XZ, filters=XZ_FILTERS) as xz, \
            tarfile.open(fileobj=xz, mode="w") as tar:
        for info in source.infolist():
            if info.is_dir() or info.filename.startswith(LEFT_OUT):
                continue
            data = bytearray(source.read(info))
            if info.filename == CUDA_PROVIDER:
                section = elf_section(data, ".nv_fatbin")
                if section is None:
                    raise ValueError(f"{CUDA_PROVIDER} has no .nv_fatbin section")
                zeroed = keep_only_arch(data, *section, keep)
            member = tarfile.TarInfo(info.filename)
            member.size = len(data)
            member.mode = 0o755 if info.filename.endswith((".so",)) or ".so." in info.filename else 0o644
            tar.addfile(member, io.BytesIO(data))
    return zeroed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", type=int, action="append", help="sm numbers to keep (default: 90)")
    args = parser.parse_args(argv)
    try:
        zeroed = pack(args.wheel, args.out, frozenset(args.arch or [90]))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        print(f"pack_cuda_runtime: {exc}", file=sys.stderr)
        return 2
    dropped = ", ".join(f"sm_{arch} {n / 2**20:.0f} MiB" for arch, n in sorted(zeroed.items()))
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB (GPU code left out: {dropped or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
