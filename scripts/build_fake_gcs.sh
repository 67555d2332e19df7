#!/usr/bin/env bash
# Build (once) the fake-gcs-server binary that the test fixtures use as a local GCS emulator.
#
# Idempotent: when the pinned version is already built, this prints its path and exits at once.
# The binary lands in ${RLAX_BIN_DIR:-~/.cache/rlax/bin}/fake-gcs-server-<version>, a stable name the
# pytest fixture (tests/support/gcs_emulator.py) looks for; it needs Go (>= 1.22) and the Go module proxy.
set -euo pipefail

VERSION="${FAKE_GCS_VERSION:-v1.56.1}"
BIN_DIR="${RLAX_BIN_DIR:-$HOME/.cache/rlax/bin}"
TARGET="$BIN_DIR/fake-gcs-server-$VERSION"

if [[ -x "$TARGET" ]]; then
  echo "$TARGET"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build_fake_gcs.sh: Go is not installed; install Go >= 1.22 to build the GCS emulator" >&2
  exit 1
fi

mkdir -p "$BIN_DIR"
STAGING="$(mktemp -d "$BIN_DIR/.build.XXXXXX")"
trap 'rm -rf "$STAGING"' EXIT
echo "building fake-gcs-server $VERSION (first time only; takes a few minutes)" >&2
# CGO off: a static binary that runs on any Linux of the same architecture.
CGO_ENABLED=0 GOBIN="$STAGING" timeout 1200 go install "github.com/fsouza/fake-gcs-server@$VERSION"
# Rename into place last, so an interrupted build never leaves a half-written binary under the final name.
mv "$STAGING/fake-gcs-server" "$TARGET"
echo "$TARGET"
