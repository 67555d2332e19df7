#!/usr/bin/env bash
# Builds Beam's Prism runner from Go modules and places it where Beam looks for its cached download.
#
# Beam's DirectRunner tries Prism first and downloads it from GitHub releases; without internet the
# download fails and Beam falls back to runners without live streaming side inputs. Building the
# same release from the Go module proxy and caching it under the name Beam would download keeps
# Beam's own logic untouched: on a machine with internet nothing changes, offline Prism is found.
# Idempotent: a cached build is reused.
set -euo pipefail

beam_version=${BEAM_VERSION:-$(python -c 'import apache_beam; print(apache_beam.__version__)')}
os=$(uname -s | tr '[:upper:]' '[:lower:]')
case "$(uname -m)" in x86_64|amd64) arch=amd64 ;; aarch64|arm64) arch=arm64 ;; *) arch=$(uname -m) ;; esac
name="apache_beam-v${beam_version}-prism-${os}-${arch}"
beam_cache="${HOME}/.apache_beam/cache/prism/bin"
build_dir="${RLAX_CACHE:-${HOME}/.cache/rlax}/prism/v${beam_version}"

if [ -f "${beam_cache}/${name}.zip" ] && [ -x "${beam_cache}/${name}" ]; then
  echo "prism: cached at ${beam_cache}/${name}"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "prism: Go is not installed; Beam will try to download Prism itself (needs internet)" >&2
  exit 0
fi
mkdir -p "${build_dir}" "${beam_cache}"
if [ ! -x "${build_dir}/prism" ]; then
  echo "prism: building v${beam_version} from Go modules (a few minutes, once)"
  GOBIN="${build_dir}" GOFLAGS=-mod=mod timeout 1200 go install "github.com/apache/beam/sdks/v2/go/cmd/prism@v${beam_version}"
fi
cp "${build_dir}/prism" "${beam_cache}/${name}"
chmod +x "${beam_cache}/${name}"
(cd "${beam_cache}" && rm -f "${name}.zip" && python - "${name}" <<'PY'
import sys, zipfile
name = sys.argv[1]
with zipfile.ZipFile(name + ".zip", "w", zipfile.ZIP_DEFLATED) as archive:
    archive.write(name, arcname=name)
PY
)
echo "prism: ready at ${beam_cache}/${name}"
