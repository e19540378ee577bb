#!/usr/bin/env bash
# Line coverage of the core by one fuzz run (docs/testing.md, "Fuzz coverage").
#
#   bash scripts/fuzz_coverage.sh [CORPUS_DIR ...]      (default: tests/fuzz/corpus)
#
# Builds fuzz_plan with clang's source-based coverage (-fprofile-instr-generate
# -fcoverage-mapping, on top of the fuzz build's ASan + UBSan) in
# $FUZZ_COV_DIR (build/fuzzcov), runs it as `make fuzz` does for $FUZZ_SECONDS
# (60) from the given corpus directories (new inputs go to $FUZZ_COV_DIR/run/corpus),
# then prints `llvm-cov report` over core/src. Not part of `make test`.
set -euo pipefail
build=${FUZZ_COV_DIR:-build/fuzzcov}
seconds=${FUZZ_SECONDS:-60}
max_len=${FUZZ_MAX_LEN:-327680}
corpora=("$@")
[ ${#corpora[@]} -gt 0 ] || corpora=(tests/fuzz/corpus)
CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHYPER_AC_FUZZ=ON -DHYPER_AC_BUILD_TESTS=OFF \
  -DCMAKE_CXX_FLAGS="-fprofile-instr-generate -fcoverage-mapping" \
  -DCMAKE_EXE_LINKER_FLAGS="-fprofile-instr-generate" >/dev/null
cmake --build "$build" -j "${JOBS:-2}" --target fuzz_plan
run=$build/run
rm -rf "$run" && mkdir -p "$run/corpus"
LLVM_PROFILE_FILE="$run/fuzz.profraw" "$build/fuzz_plan" -seed=1 -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -max_len="$max_len" -dict=tests/fuzz/json.dict -artifact_prefix="$run/" \
  -print_final_stats=1 "$run/corpus" "${corpora[@]}" 2>"$run/fuzz.log" || { tail -30 "$run/fuzz.log"; exit 1; }
grep -E "^(INFO: seed corpus|#[0-9]+ +(INITED|DONE))|stat::number_of_executed_units" "$run/fuzz.log" || true
llvm-profdata merge -sparse "$run/fuzz.profraw" -o "$run/fuzz.profdata"
llvm-cov report "$build/fuzz_plan" -instr-profile="$run/fuzz.profdata" core/src/*.cc
