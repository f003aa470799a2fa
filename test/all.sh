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
#
# Every step runs whatever failed before it (test/steps.sh): the end lists
# the steps that failed, and the exit status is 1 if any did.
set -uo pipefail
cd "$(dirname "$0")/.."
. test/steps.sh

# What this run could not do, said again at the end.
skipped=()
# The Python runs' output, until it is shown; removed however the run ends.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

gofmt_step() {
  local unformatted
  unformatted=$(git ls-files '*.go' | xargs gofmt -l) || return 1
  if [ -n "$unformatted" ]; then echo "gofmt would change:"; echo "$unformatted"; return 1; fi
}
step gofmt gofmt_step

step "go vet" go vet ./...

if command -v staticcheck >/dev/null; then
  step staticcheck staticcheck ./...
else
  skipped+=("staticcheck: not on PATH; CI installs it: go install honnef.co/go/tools/cmd/staticcheck@v0.8.2 (then PATH=\"\$(go env GOPATH)/bin:\$PATH\")")
  echo "== staticcheck: SKIPPED, not installed (see the summary at the end)"
fi

deadcode_step() {
  # Functions the binary can never call. The fake engine (agent/enginetest)
  # is in the binary for selftest, which uses part of it; the rest is what
  # the tests drive it with.
  local dead
  dead=$(deadcode . | grep -v '^agent/enginetest/')
  if [ -n "$dead" ]; then
    echo "unreachable from main (remove it, or move it into the test that uses it):"; echo "$dead"; return 1
  fi
}
if ! command -v deadcode >/dev/null; then
  skipped+=("deadcode: not on PATH; CI installs it: go install golang.org/x/tools/cmd/deadcode@v0.51.0")
  echo "== deadcode: SKIPPED, not installed (see the summary at the end)"
else
  step deadcode deadcode_step
fi

cross_builds() {
  local target
  for target in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
    CGO_ENABLED=0 GOOS=${target%/*} GOARCH=${target#*/} go build -o /dev/null . || return 1
    echo "  $target ok"
  done
}
step "cross builds (CGO_ENABLED=0)" cross_builds

echo "== runtime tests (Python), in the background while the fuzzers run"
# One run per interpreter, all at once and beside the fuzzers: most of each
# run's time is spent waiting for the processes and timeouts it tests, not
# on the CPU. Each run's output is shown in turn after the fuzzers.
pythons=(/usr/bin/python3)
command -v python3 >/dev/null && pythons+=("$(command -v python3)")
for v in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*; do
  [ -x "$v/bin/python3" ] && pythons+=("$v/bin/python3")
done
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

# Each fuzzer runs for a number of inputs, not a time: at a -fuzztime
# deadline, Go 1.26's fuzz coordinator can fail the run with "context
# deadline exceeded" and no failing input (go.dev/issue/75804, fixed in Go
# 1.27), as a loaded machine did. The counts take about 10 s each or less
# on two busy cores (measured there with -fuzztime 10s); a fuzzer not
# listed gets the default. A failing input still fails its step, and go
# test writes it under testdata/fuzz.
fuzz_inputs() {
  case $1 in
    FuzzSalvageCall) echo 200000 ;;
    FuzzClassify | FuzzEngineMessage) echo 50000 ;;
    FuzzTextFrame) echo 40000 ;;
    FuzzStampCallID) echo 20000 ;;
    FuzzValidJSON) echo 2000 ;;
    *) echo 1000 ;; # FuzzLineReader: about 270 a second
  esac
}
for file in $(grep -rl --include='*_test.go' '^func Fuzz' agent platform installer); do
  for fuzzer in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$file" | cut -d' ' -f2); do
    inputs=$(fuzz_inputs "$fuzzer")
    step "fuzz $fuzzer (${inputs} inputs)" go test -run '^$' -fuzz "^${fuzzer}\$" -fuzztime "${inputs}x" "./$(dirname "$file")/"
  done
done

python_results() {
  local n status=0
  for n in "${!runs[@]}"; do
    wait "${runs[$n]}" || status=1
    cat "$logs/$n"
  done
  [ "$status" = 0 ] || echo "the runtime's Python tests failed (above)"
  return "$status"
}
step "runtime tests (Python): results" python_results

if [ "$(id -u)" != 0 ]; then
  skipped+=("the tests that need root (systemd under systemd-nspawn, packages, podman, cgroups per call): run as root; .ci/run installs what they need on Debian")
fi
# go test -json, summarised by test/gotest_lines.py: a line per top-level
# test as it ends, so a long run shows where it is and a timeout where it
# was; each package's closing ok or FAIL line as go test writes it.
go_test_race() {
  echo "(one line per test as it ends; a failed test's whole output)"
  go test -race -count=1 -timeout 75m -json ./... | python3 test/gotest_lines.py
}
step "go test -race" go_test_race

if [ ${#skipped[@]} -gt 0 ]; then
  echo "== not run here (CI runs them)"
  printf '  %s\n' "${skipped[@]}"
  echo "  and every test above marked --- SKIP, with its reason"
fi
finish
