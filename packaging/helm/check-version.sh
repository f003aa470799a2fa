#!/bin/sh
# Refuses a release whose chart does not say the version it releases: the
# chart's appVersion is the worker image's default tag (workerImage.tag), so
# a chart left at an older appVersion would install the older worker.
# GoReleaser's before hook runs it for a release (not a snapshot).
#
# Usage: check-version.sh VERSION
set -eu
version=${1:?usage: check-version.sh VERSION}
chart="$(dirname "$0")/fluksio-worker/Chart.yaml"
app=$(sed -n 's/^appVersion:[[:space:]]*"\{0,1\}\([^"]*\)"\{0,1\}[[:space:]]*$/\1/p' "$chart")
if [ "$app" != "$version" ]; then
  echo "$chart says appVersion \"$app\", but this release is $version: set appVersion to \"$version\" (the worker image's default tag) and version to the chart's next version, commit, and tag again" >&2
  exit 1
fi
