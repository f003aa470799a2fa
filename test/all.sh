#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, vet, the darwin build,
# the runtime's Python tests on every Python 3.8+ found, a short fuzz of
# each fuzzer, then every Go test under the race detector (the service and
# package tests boot a real systemd with systemd-nspawn; they need root,
# debootstrap and systemd-container, see .ci/run).
#
# Run it from a clone as root for everything (`bash test/all.sh` in a root
# shell, `sudo bash test/all.sh` from a user's): without root the tests
# that boot systemd or need a cgroup skip themselves, and the summary at the
# end lists them. The first run downloads the Go modules (go.sum) from the
# module proxy; the systemd tests build a Debian rootfs with debootstrap.
set -euo pipefail
cd "$(dirname "$0")/.."

# What this run could not do, said again at the end.
skipped=()

echo "== gofmt"
unformatted=$(git ls-files '*.go' | xargs gofmt -l)
if [ -n "$unformatted" ]; then echo "gofmt would change:"; echo "$unformatted"; exit 1; fi

echo "== go vet"
go vet ./...
if command -v staticcheck >/dev/null; then
  echo "== staticcheck"
  staticcheck ./...
else
  skipped+=("staticcheck: not on PATH; CI installs it: go install honnef.co/go/tools/cmd/staticcheck@v0.8.2 (then PATH=\"\$(go env GOPATH)/bin:\$PATH\")")
  echo "== staticcheck: SKIPPED, not installed (see the summary at the end)"
fi
if ! command -v deadcode >/dev/null; then
  skipped+=("deadcode: not on PATH; CI installs it: go install golang.org/x/tools/cmd/deadcode@v0.51.0")
  echo "== deadcode: SKIPPED, not installed (see the summary at the end)"
else
  echo "== deadcode"
  # Functions the binary can never call. The fake engine (agent/enginetest)
  # is in the binary for selftest, which uses part of it; the rest is what
  # the tests drive it with.
  dead=$(deadcode . | grep -v '^agent/enginetest/' || true)
  if [ -n "$dead" ]; then
    echo "unreachable from main (remove it, or move it into the test that uses it):"; echo "$dead"; exit 1
  fi
fi

echo "== cross builds (CGO_ENABLED=0)"
for target in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
  CGO_ENABLED=0 GOOS=${target%/*} GOARCH=${target#*/} go build -o /dev/null . || exit 1
  echo "  $target ok"
done

echo "== runtime tests (Python), in the background while the fuzzers run"
# One run per interpreter, all at once and beside the fuzzers: most of each
# run's time is spent waiting for the processes and timeouts it tests, not
# on the CPU. Each run's output is shown in turn after the fuzzers.
pythons=(/usr/bin/python3)
command -v python3 >/dev/null && pythons+=("$(command -v python3)")
for v in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*; do
  [ -x "$v/bin/python3" ] && pythons+=("$v/bin/python3")
done
logs=$(mktemp -d)
seen=""
runs=()
for py in "${pythons[@]}"; do
  # The interpreter itself, not a shim or link to it; skip any below 3.8.
  real=$("$py" -c 'import os, sys; sys.exit(1) if sys.version_info < (3, 8) else print(os.path.realpath(sys.executable))' 2>/dev/null) || continue
  case " $seen " in *" $real "*) continue ;; esac
  seen="$seen $real"
  n=${#runs[@]}
  echo "-- $py ($("$py" --version 2>&1))" >"$logs/$n"
  PYTHONDONTWRITEBYTECODE=1 FLUKSIO_TEST_PYTHON="$py" "$py" -m unittest discover -s agent/runtime/tests -t agent/runtime >>"$logs/$n" 2>&1 &
  runs+=($!)
done

echo "== fuzz (10 s each)"
for file in $(grep -rl --include='*_test.go' '^func Fuzz' agent platform installer); do
  for fuzzer in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$file" | cut -d' ' -f2); do
    go test -run '^$' -fuzz "^${fuzzer}\$" -fuzztime 10s "./$(dirname "$file")/"
  done
done

echo "== runtime tests (Python): results"
failed=0
for n in "${!runs[@]}"; do
  wait "${runs[$n]}" || failed=1
  cat "$logs/$n"
done
rm -rf "$logs"
[ "$failed" = 0 ] || { echo "the runtime's Python tests failed (above)"; exit 1; }

echo "== go test -race (one line per test as it ends; a failed test's whole output)"
if [ "$(id -u)" != 0 ]; then
  skipped+=("the tests that need root (systemd under systemd-nspawn, packages, podman, cgroups per call): run as root; .ci/run installs what they need on Debian")
fi
# go test -json, summarised by test/gotest_lines.py: a line per top-level
# test as it ends, so a long run shows where it is and a timeout where it
# was; each package's closing ok or FAIL line as go test writes it.
go_test_status=0
go test -race -count=1 -timeout 75m -json ./... | python3 test/gotest_lines.py || go_test_status=$?

if [ ${#skipped[@]} -gt 0 ]; then
  echo "== not run here (CI runs them)"
  printf '  %s\n' "${skipped[@]}"
  echo "  and every test above marked --- SKIP, with its reason"
fi
exit "$go_test_status"
