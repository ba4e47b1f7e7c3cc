#!/usr/bin/env bash
# Committed-secrets scan: detect-secrets over every tracked file, against the reviewed baseline
# (.secrets.baseline). Every finding in the baseline was reviewed and marked `"is_secret": false`
# (test vectors, fixture keys, placeholder tokens). A finding that is not in the baseline, or one
# marked anything but false, fails the run; the output names file, line and detector, never the value.
# Read-only: the rescan goes to a temporary copy of the baseline.
#
# After reviewing a new test fixture, refresh the baseline and mark it:
#   detect-secrets scan --baseline .secrets.baseline && detect-secrets audit .secrets.baseline
set -euo pipefail
cd "$(dirname "$0")/.."
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
cp .secrets.baseline "$tmp"
python3 -m detect_secrets scan --baseline "$tmp" >/dev/null
python3 - "$tmp" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))["results"]
bad = [(f, r["line_number"], r["type"]) for f, rs in sorted(results.items()) for r in rs
       if r.get("is_secret") is not False]
reviewed = sum(len(rs) for rs in results.values()) - len(bad)
for f, line, kind in bad:
    print(f"secrets: {f}:{line}: {kind} not reviewed in .secrets.baseline")
if bad:
    print(f"secrets: {len(bad)} unreviewed finding(s); review each, then see .ci/secrets-check.sh")
    sys.exit(1)
print(f"secrets: ok ({reviewed} reviewed test fixtures, 0 new)")
PY
