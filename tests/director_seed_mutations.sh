#!/bin/bash
# Seed-change mutation check (director.md §6.5): reverts one rule at a time in a scratch copy of
# the crate and lists which roll scenarios (tests/director_roll.rs) fail. Every D-32..D-49 case must
# fail under at least the mutation of the rule it tests. Usage: tests/director_seed_mutations.sh
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
rm -rf /tmp/orca-mut && mkdir -p /tmp/orca-mut
cp -r "$SRC/Cargo.toml" "$SRC/Cargo.lock" "$SRC/src" "$SRC/sql" "$SRC/tests" /tmp/orca-mut/
cd /tmp/orca-mut
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-wt}
export CARGO_TARGET_DIR=/work/target-wt
unset ORCA_RELAY_TEST_POSTGRES_URL
cp src/director/placement.rs /tmp/orca-mut/placement.orig
run() {
  name="$1"; shift
  cp /tmp/orca-mut/placement.orig src/director/placement.rs
  python3 - "$@" <<'PY'
import sys
p='src/director/placement.rs'
s=open(p).read()
for i in range(1,len(sys.argv),2):
    old,new=sys.argv[i],sys.argv[i+1]
    assert old in s, old
    s=s.replace(old,new,1)
open(p,'w').write(s)
PY
  echo "== $name"
  cargo test --test director_roll 2>&1 | grep -E "^test .*FAILED|test result" 
}
run "revert-whole-rule (no roll-replaced move)" "if host.roll_isolated(home, now) && (live || host.roll_replaced(home, now)) {" "if host.roll_isolated(home, now) && live {"
run "drop started_at > stamp" "        if runtime.started_at <= stamp {
            return false;
        }" ""
run "drop zero-connections check" "                        && t.total_connections == 0
                        && t.in_flight_connections == 0" ""
run "drop freshness check" "        if !home.fresh(now) {
            return false;
        }" ""
run "drop telemetry presence/age check" "                None => false," "                None => true,"
run "drop 2h stamp age (roll_stamp_active)" "    pub fn roll_isolated(&self, home: Option<&CellView>, now: i64) -> bool {
        home.is_some_and(|h| h.roll_stamp_active(now))" "    pub fn roll_isolated(&self, home: Option<&CellView>, now: i64) -> bool {
        home.is_some_and(|h| h.admission == Admission::MigrationOnly && h.roll_isolated_at.is_some())"
run "roll-replaced without roll isolation" "if host.roll_isolated(home, now) && (live || host.roll_replaced(home, now)) {" "if (host.roll_isolated(home, now) && live) || host.roll_replaced(home, now) {" \
    "        if !self.roll_isolated(home, now) {
            return false;
        }" "" \
    "        let (stamp, runtime) = match (home.roll_isolated_at, home.runtime.as_ref()) {
            (Some(s), Some(r)) => (s, r)," "        let (stamp, runtime) = match (home.roll_isolated_at.or(Some(0)), home.runtime.as_ref()) {
            (Some(s), Some(r)) => (s, r),"
cp /tmp/orca-mut/placement.orig src/director/placement.rs
