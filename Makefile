# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
BUILD_DIR := build/py
SOURCES := $(shell find core bindings cli tests/cpp -name '*.cc' -o -name '*.h' -o -name '*.cmake' 2>/dev/null) CMakeLists.txt pyproject.toml
STAMP := $(BUILD_DIR)/.installed

.PHONY: all deps build demo test test-cpp test-python bench clean

all: build

deps:
	@bash scripts/install-deps.sh

$(STAMP): $(SOURCES) scripts/install-deps.sh
	@bash scripts/install-deps.sh
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	@touch $(STAMP)

build: $(STAMP)

demo: build
	$(PYTHON) -m hyper_ac demo

test-cpp: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure

test-python: build
	$(PYTHON) -m pytest tests/python

test: test-cpp test-python

bench: build
	$(PYTHON) -m benchmarks

clean:
	rm -rf build
