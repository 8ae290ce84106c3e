#!/usr/bin/env bash
# Runs the suite one test group per interpreter: the fault suite, each integration area, and the
# unit tests. A group cannot leave process-wide state (MAX's runtime, signal handlers, threads)
# behind for the next, and every group still runs when an earlier one fails. Each group prints
# pytest's 15 slowest tests and its wall time; a table of every group's time closes the run.
# Exits non-zero if any group fails or collects no tests (pytest's exit 5).
set -uo pipefail
PYTEST=${1:?pytest}
groups=(tests/faults)
for dir in tests/integration/*/; do
  [ -n "$(find "$dir" -name 'test_*.py' -print -quit)" ] && groups+=("${dir%/}")
done
groups+=(tests/unit)
failed=()
timings=()
for group in "${groups[@]}"; do
  echo "=== $group"
  started=$(date +%s)
  "$PYTEST" -p no:cacheprovider --durations=15 "$group"
  status=$?
  seconds=$(( $(date +%s) - started ))
  [ "$status" -eq 0 ] || failed+=("$group")
  timings+=("$(printf '%6ds  %-6s %s' "$seconds" "$([ "$status" -eq 0 ] && echo ok || echo FAILED)" "$group")")
  echo "=== $group: ${seconds}s (exit $status)"
done
echo "=== wall time per group"
printf '%s\n' "${timings[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED groups: ${failed[*]}" >&2
  exit 1
fi
echo "every test group passed (${#groups[@]} groups)"
