#!/usr/bin/env bash
# Runs the suite one test group per interpreter: the fault suite, each integration area, and the
# unit tests. A group cannot leave process-wide state (MAX's runtime, signal handlers, threads)
# behind for the next, and every group still runs when an earlier one fails. Exits non-zero if
# any group fails or collects no tests (pytest's exit 5).
set -uo pipefail
PYTEST=${1:?pytest}
groups=(tests/faults)
for dir in tests/integration/*/; do
  [ -n "$(find "$dir" -name 'test_*.py' -print -quit)" ] && groups+=("${dir%/}")
done
groups+=(tests/unit)
failed=()
for group in "${groups[@]}"; do
  echo "=== $group"
  "$PYTEST" -p no:cacheprovider "$group" || failed+=("$group")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED groups: ${failed[*]}" >&2
  exit 1
fi
echo "every test group passed (${#groups[@]} groups)"
