#!/usr/bin/env bash
# Runs every Go fuzz target in the repository for DURATION each (default
# 30s). Seeds live under each package's testdata/fuzz; a failure writes the
# crashing input there, to be committed with its fix.
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-30s}"
fail=0
while IFS= read -r file; do
	pkg="./$(dirname "$file")"
	for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]+' "$file" | sed 's/^func //'); do
		echo "== $pkg $target ($duration)"
		if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$duration" "$pkg"; then
			echo "FAIL: $pkg $target" >&2
			fail=1
		fi
	done
done < <(grep -rlE '^func Fuzz' --include='*_test.go' . | sed 's|^\./||' | sort)
exit "$fail"
