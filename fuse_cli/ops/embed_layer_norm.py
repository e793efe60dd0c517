"""com.microsoft EmbedLayerNormalization: BERT's embeddings and their norm. No pass emits it:
measured slower on the CPU."""

from __future__ import annotations

from fuse_cli.ops.record import MS, Operator, Slower, kernels

RECORDS = (Operator(
    "EmbedLayerNormalization", MS,
    support=kernels("EmbedLayerNormalization", "float32", "float32 float16",
                    "int32 ids only (int64 exports need Casts); no pass emits it: measured slower on the CPU (SLOWER)"),
    slower=(Slower(
        "EmbedLayerNormalization", "cpu",
        "onnxruntime 1.31's CPU EmbedLayerNormalization measured 1.39-1.55x slower than BERT's word + position + "
        "segment Gathers, Adds and LayerNormalization it would replace (target {target})",
        "benchmarks/bert_packed_attention.py, one thread, fp32, 21 interleaved rounds, at graph optimization "
        "disabled and all alike, Casts of the int64 ids to int32 included: hidden 256 [1, 128] 46 vs 32 us "
        "(1.43-1.45x), [8, 128] 334-345 vs 220-229 us (1.50-1.52x); hidden 768 [1, 128] 125 vs 90 us (1.39x), "
        "[8, 128] 977-1041 vs 630-731 us (1.43-1.55x); a second session of the decomposed form within "
        "0.993-1.014x. In fuse's ort-cpu "
        "output of the corpus's bert-small and bert-base (opset 14) 1.00-1.02x at disabled, 1.08-1.20x at all, and "
        "a higher measured peak (1.43 -> 2.33 MiB, 4.14 -> 7.21 MiB at batch 1) (benchmarks/results/"
        "bert_packed_attention.md).",
        leaves_pipeline=True),),
),)
