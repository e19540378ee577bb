# The two commands a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
BUILD_DIR := build/py
SOURCES := $(shell find core bindings cli tests/cpp -name '*.cc' -o -name '*.h' -o -name '*.cmake' 2>/dev/null) CMakeLists.txt pyproject.toml hyper_ac/configs/op_policy.yaml
STAMP := $(BUILD_DIR)/.installed

.PHONY: all deps build demo test test-cpp test-python test-slow sanitize-build test-sanitize fuzz fuzz-coverage bench clean

# One clang build (no Python modules) serves the sanitized tests and the fuzz
# target: ASan + UBSan everywhere, libFuzzer's coverage instrumentation too, so
# the core is compiled once for both. The fuzz run's corpus and findings go to FUZZ_DIR.
SANITIZE_DIR := build/sanitize
FUZZ_DIR := build/fuzz
FUZZ_SECONDS ?= 60
# Above the largest seed (T5's graph, 293 KB; scripts/make_fuzz_corpus.py).
FUZZ_MAX_LEN ?= 327680
JOBS ?= 2

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

# `slow` tests (pyproject.toml markers: peaks measured over several Inductor
# compiles) run apart, in test-slow, to keep `make test` under 25 minutes.
# PYTEST_WORKERS pytest-xdist processes, one test module each at a time
# (--dist loadfile keeps a module's fixtures in one process); 0 = in this process.
PYTEST_WORKERS ?= 2
test-python: build
	$(PYTHON) -m pytest tests/python -m "not slow" -n $(PYTEST_WORKERS) --dist loadfile

test-slow: build
	$(PYTHON) -m pytest tests/python -m slow

# ASan + UBSan (-fno-sanitize-recover: the first report fails the test).
sanitize-build:
	@bash scripts/install-deps.sh
	CXX=clang++ cmake -S . -B $(SANITIZE_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHYPER_AC_FUZZ=ON >/dev/null
	cmake --build $(SANITIZE_DIR) -j $(JOBS)

test-sanitize: sanitize-build
	ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --test-dir $(SANITIZE_DIR) --output-on-failure

# libFuzzer over graph JSON + config JSON -> plan (docs/testing.md): a fixed-seed
# run of FUZZ_SECONDS over tests/fuzz/corpus (read recursively: its rejected/
# seeds too); new inputs go to build/fuzz/corpus, a finding to build/fuzz/crash-*
# (and fails the target).
fuzz: sanitize-build
	mkdir -p $(FUZZ_DIR)/corpus
	$(SANITIZE_DIR)/fuzz_plan -seed=1 -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -max_len=$(FUZZ_MAX_LEN) \
	  -dict=tests/fuzz/json.dict -artifact_prefix=$(FUZZ_DIR)/ -print_final_stats=1 \
	  $(FUZZ_DIR)/corpus tests/fuzz/corpus
	$(SANITIZE_DIR)/fuzz_plan -runs=0 tests/fuzz/regressions/fixed

# The same run with clang's source-based coverage (build/fuzzcov): llvm-cov's
# line coverage of core/src (docs/testing.md, "Fuzz coverage"). Not in `make test`.
fuzz-coverage:
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_MAX_LEN=$(FUZZ_MAX_LEN) JOBS=$(JOBS) bash scripts/fuzz_coverage.sh

test: test-cpp test-python test-sanitize fuzz

bench: build
	$(PYTHON) -m benchmarks

clean:
	rm -rf build
