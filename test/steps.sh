# The step runner of test/all.sh, sourced by it (and by
# test/allsh_test.go): a failing step is recorded and the next one still
# runs, so one failure never hides the results of the others; finish lists
# the steps that failed and exits non-zero if any did.
#
# A step is a command, usually a function; it fails by returning non-zero.
# `set -e` does not apply inside it (bash ignores it in a function called
# as a condition), so a step's commands are chained with && or return
# their status themselves.

failed_steps=()

# step NAME COMMAND [ARG...]: runs one step under a "== NAME" header.
step() {
  local name=$1
  shift
  echo "== $name"
  if ! "$@"; then
    failed_steps+=("$name")
    echo "== $name: FAILED (the run goes on; listed again at the end)"
  fi
}

# finish: says which steps failed and exits 1, or exits 0.
finish() {
  if [ ${#failed_steps[@]} -gt 0 ]; then
    echo "== FAILED: ${#failed_steps[@]} step(s), each above:"
    printf '  %s\n' "${failed_steps[@]}"
    exit 1
  fi
  echo "== every step passed"
  exit 0
}
