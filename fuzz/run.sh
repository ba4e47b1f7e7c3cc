#!/usr/bin/env bash
# Builds every fuzz target and runs each for a bounded time (docs/development.md, Fuzzing). The whole step,
# build included, aims at FUZZ_BUDGET_S seconds (default 300): what the build leaves is shared
# evenly between the targets, at least FUZZ_MIN_S (default 5) each. A crash fails the run and
# leaves its input in fuzz/artifacts/<target>/. Prints the executions each target reached.
#
# Stable toolchain: `cargo fuzz build -s none` (no sanitizer, so no nightly -Z flag; the relay
# forbids unsafe code, so coverage guidance and the targets' assertions are what find bugs).
set -euo pipefail
cd "$(dirname "$0")"
budget=${FUZZ_BUDGET_S:-300}
min=${FUZZ_MIN_S:-5}
start=$(date +%s)
# The instrumented build lives outside the clone, so a CI run on the same machine rebuilds only the
# relay itself, not its whole dependency tree.
target_dir=${FUZZ_TARGET_DIR:-$HOME/.cache/orca-relay/fuzz-target}
mkdir -p "$target_dir"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --version 0.13.2
fi
cargo fuzz build -s none --target-dir "$target_dir"
targets=$(cargo fuzz list)
n=$(echo "$targets" | wc -l)
left=$(( budget - ($(date +%s) - start) ))
per=$(( left / n ))
[ "$per" -lt "$min" ] && per=$min
echo "fuzz: build took $(( $(date +%s) - start )) s; $per s per target"
status=0
for t in $targets; do
  work=$(mktemp -d)
  log="$work/log"
  # New inputs go to the scratch corpus (first directory); the committed seeds stay as they are.
  if cargo fuzz run -s none --target-dir "$target_dir" "$t" "$work" "corpus/$t" -- -max_total_time="$per" -max_len=8192 \
      -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz: $t ok, ${execs:-?} executions in $per s, $cov"
  else
    echo "fuzz: $t CRASHED"; tail -40 "$log"; status=1
  fi
  rm -rf "$work"
done
echo "fuzz: total $(( $(date +%s) - start )) s"
exit "$status"
