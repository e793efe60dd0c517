"""What `fuse bench` measures, as records: the timing settings, each model's latency and peak per
provider and optimization level, the result. Below both bench.py, which fills them, and
report/bench.py, which renders them."""

from __future__ import annotations

from dataclasses import dataclass

BENCH_SCHEMA_VERSION = 1
# measure_peak's figures carry noise of tens of pages (see fuse_cli.analysis.measure): a ratio of
# two peaks smaller than this says more about the noise than about the models.
PEAK_RATIO_FLOOR_BYTES = 1 << 20


@dataclass(frozen=True)
class Timing:
    """How long to time. The defaults give stable medians for models that run in milliseconds;
    QUICK is for tests and smoke runs (figures from it are not worth comparing)."""

    warmup_runs: int = 3
    warmup_seconds: float = 0.2
    min_samples: int = 15
    max_samples: int = 300
    min_seconds: float = 1.0
    sample_seconds: float = 0.002
    session_repeats: int = 3
    peak_repeats: int = 3

    def __post_init__(self) -> None:
        if self.warmup_runs < 1 or self.min_samples < 1 or self.session_repeats < 1 or self.peak_repeats < 1:
            raise ValueError("warm-up runs, samples and repeats must be at least 1")
        if self.max_samples < self.min_samples:
            raise ValueError(f"max_samples ({self.max_samples}) is below min_samples ({self.min_samples})")


QUICK = Timing(warmup_runs=1, warmup_seconds=0.0, min_samples=3, max_samples=3, min_seconds=0.0,
               sample_seconds=0.0, session_repeats=1, peak_repeats=1)


@dataclass(frozen=True)
class Latency:
    """Per-run times in milliseconds over `samples` samples of `runs_per_sample` runs each."""

    samples: int
    runs_per_sample: int
    wall_median_ms: float
    wall_p90_ms: float
    cpu_median_ms: float
    cpu_p90_ms: float

    @property
    def runs(self) -> int:
        return self.samples * self.runs_per_sample


@dataclass(frozen=True)
class BenchRow:
    """One model on one provider at one graph-optimization level. The ratios are this row over
    the original's row of the same provider and level (below 1: the fused model is better); they
    are None on the original's rows, and where either side has no figure."""

    model: str               # "original" or "fused"
    provider: str            # "CPU" or "CUDA"
    graph_optimization: str  # "disabled" (ORT_DISABLE_ALL) or "all" (ORT_ENABLE_ALL)
    session_ms: float
    samples: int
    runs_per_sample: int
    wall_median_ms: float
    wall_p90_ms: float
    cpu_median_ms: float
    cpu_p90_ms: float
    peak_bytes: int | None   # measured on CPU / disabled only
    wall_ratio: float | None
    cpu_ratio: float | None
    peak_ratio: float | None
    session_ratio: float | None


@dataclass(frozen=True)
class BenchResult:
    original: str
    optimized: str | None  # None: fused in memory by fuse with `fused_by`'s configuration
    fused_by: str
    nodes_original: int
    nodes_fused: int
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    rows: tuple[BenchRow, ...]
    skipped_providers: tuple[tuple[str, str], ...]  # (provider, why it was not benchmarked)
    peak_method: str | None
    peak_not_measured: str | None  # why there is no peak figure, when there is none
    timing: Timing
    onnxruntime_version: str
    seed: int
