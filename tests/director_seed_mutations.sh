#!/bin/bash
# Seed-change mutation check (docs/deploy/cluster.md, the seed change): reverts one rule at a time in a
# scratch copy of the crate and lists which roll scenarios (tests/director_roll.rs, SQLite) fail.
# Every D-32..D-49 case fails under the mutation of the rule it tests.
# Usage: tests/director_seed_mutations.sh   (needs python3). It builds in its own target directory
# (ORCA_MUT_TARGET_DIR, default /tmp/orca-mut-target): a workspace copy at another path produces
# artifacts with the same names, so sharing a target directory could leave mutated builds behind.
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=/tmp/orca-mut
rm -rf "$WORK" && mkdir -p "$WORK"
cp -r "$SRC/Cargo.toml" "$SRC/Cargo.lock" "$SRC/src" "$SRC/sql" "$SRC/tests" "$WORK"/
cd "$WORK"
export CARGO_TARGET_DIR=${ORCA_MUT_TARGET_DIR:-/tmp/orca-mut-target}
unset ORCA_RELAY_TEST_POSTGRES_URL
cp -r src /tmp/orca-mut-src.orig
P=src/director/placement.rs
S=src/director/assign.rs

# run NAME FILE OLD NEW [FILE OLD NEW]...
run() {
  name="$1"; shift
  rm -rf src && cp -r /tmp/orca-mut-src.orig src
  python3 - "$@" <<'PY'
import sys
a = sys.argv[1:]
for i in range(0, len(a), 3):
    f, old, new = a[i], a[i + 1], a[i + 2]
    s = open(f).read()
    assert old in s, (f, old)
    open(f, 'w').write(s.replace(old, new, 1))
PY
  echo "== $name"
  cargo test --test director_roll 2>&1 | grep -E "^test .*FAILED|test result"
}

run "revert the seed change in both paths (I and M)" \
  $P "if host.roll_isolated(home, now) && (live || host.roll_replaced(home, now)) {" "if host.roll_isolated(home, now) && live {" \
  $S "&& (live || hv.roll_replaced(home.as_ref(), now))" "&& live"
run "revert only in M (all-rows path)" \
  $P "if host.roll_isolated(home, now) && (live || host.roll_replaced(home, now)) {" "if host.roll_isolated(home, now) && live {"
run "revert only in I (narrow path; M gives the same result by spec)" \
  $S "&& (live || hv.roll_replaced(home.as_ref(), now))" "&& live"
run "drop condition 2: started_at > stamp" \
  $P "        if runtime.started_at <= stamp {
            return false;
        }" ""
run "drop condition 4: zero connections" \
  $P "                        && t.total_connections == 0
                        && t.in_flight_connections == 0" ""
run "drop condition 3: freshness" \
  $P "        if !home.fresh(now) {
            return false;
        }" ""
run "drop condition 3 and the 45 s telemetry age of condition 4 (capped D-38/D-39)" \
  $P "        if !home.fresh(now) {
            return false;
        }" "" \
  $P "                    t.observed_at > now - HEARTBEAT_TTL_MS
                        && t.total_connections == 0" "                    t.total_connections == 0"
run "drop condition 4: telemetry present" \
  $P "                None => false," "                None => true,"
run "drop condition 1 (2 h stamp age)" \
  $P "        home.is_some_and(|h| h.roll_stamp_active(now))" "        home.is_some_and(|h| h.admission == Admission::MigrationOnly && h.roll_isolated_at.is_some())"
run "roll-replaced without roll isolation" \
  $P "if host.roll_isolated(home, now) && (live || host.roll_replaced(home, now)) {" "if (host.roll_isolated(home, now) && live) || host.roll_replaced(home, now) {" \
  $P "        if !self.roll_isolated(home, now) {
            return false;
        }" "" \
  $P "        let (stamp, runtime) = match (home.roll_isolated_at, home.runtime.as_ref()) {
            (Some(s), Some(r)) => (s, r)," "        let (stamp, runtime) = match (home.roll_isolated_at.or(Some(0)), home.runtime.as_ref()) {
            (Some(s), Some(r)) => (s, r),"
rm -rf /tmp/orca-mut-src.orig
