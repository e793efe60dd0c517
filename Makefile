# One virtualenv per checkout; every target installs it on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test sample-models bench fuzz clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,plot]'
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p build
	$(BIN)/fuse optimize sample_models/cnn_bn_relu.onnx -o build/cnn_bn_relu.fused.onnx
	$(BIN)/fuse report sample_models/transformer_block_opset17.onnx --dim batch=1 --dim sequence=128

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 tests

sample-models: $(STAMP)
	$(BIN)/python sample_models/build.py

clean:
	rm -rf $(VENV) build .pytest_cache
