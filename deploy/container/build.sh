#!/usr/bin/env bash
# Build gpugate's container image reproducibly (docs/production.md, "The image").
#
#   deploy/container/build.sh            # wheelhouse + Debian bases (mmdebstrap) + the image
#   deploy/container/build.sh --lock     # only rewrite requirements.lock from a clean venv
#
# Reproducible: the dependencies are the pinned wheels of requirements.lock, built into
# build/wheels on this machine (the image build itself reads no index); the two bases are made
# from Debian's packages by mmdebstrap with SOURCE_DATE_EPOCH (the last commit's time) and used
# by digest; the image's layers carry that same timestamp (--timestamp) and no build history.
# Two builds of one commit give the same layers (checked: same diff ids, no cache); with
# FORMAT=oci the same digest too, while the docker format (the default, which keeps the
# HEALTHCHECK that OCI images cannot hold) records the builder's container id in its config.
# Set BUILD_BASE and RUN_BASE (image@sha256:...) to build on other bases, e.g.
# python:3.11-slim-bookworm.
#
# Environment: ENGINE (podman), TAG (localhost/gpugate:<version>), FORMAT (docker | oci),
# ENGINE_FLAGS (extra flags for `build`, e.g. "--runtime runc" where crun cannot run),
# SUITE (bookworm), MIRROR.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=deploy/container
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH
ENGINE=${ENGINE:-podman}
FORMAT=${FORMAT:-docker}  # docker keeps the HEALTHCHECK; oci gives a bit-identical digest
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-}
version=$(python3 -c 'import re,pathlib; print(re.search(r"__version__ = \"(.+?)\"", pathlib.Path("src/gpugate/__init__.py").read_text())[1])')
TAG=${TAG:-localhost/gpugate:$version}
read -r -a engine_flags <<< "${ENGINE_FLAGS:-}"

lock() {
  venv=$(mktemp -d)
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet -c constraints.txt .  # the versions CI tests
  { echo "# The runtime dependencies of the image, pinned (pip freeze of a clean \`pip install .\`)."
    echo "# Regenerate: deploy/container/build.sh --lock. The image installs exactly these, offline."
    "$venv/bin/pip" freeze --exclude gpugate --exclude pip --exclude setuptools
  } > "$here/requirements.lock"
  rm -rf "$venv"
}

wheelhouse() {
  rm -rf build/wheels && mkdir -p build/wheels
  python3 -m pip download --quiet --no-deps --only-binary :all: --python-version 3.11 \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any \
    -r "$here/requirements.lock" -d build/wheels
  python3 -m pip wheel --quiet --no-deps . -w build/wheels
}

base() {  # base NAME PACKAGES -> prints NAME@sha256:...
  local name=$1 packages=$2 dir=build/$1
  rm -rf "$dir" && mkdir -p "$dir"
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$SUITE" "$dir/rootfs.tar" ${MIRROR:+"$MIRROR"} >&2
  # Built, not imported: `import` stamps the image with the time of day; a build from scratch
  # takes SOURCE_DATE_EPOCH, so the same rootfs gives the same digest.
  printf 'FROM scratch\nADD rootfs.tar /\nCMD ["/bin/sh"]\n' > "$dir/Containerfile"
  "$ENGINE" build "${engine_flags[@]}" --quiet --format oci --omit-history --timestamp "$SOURCE_DATE_EPOCH" \
    -t "localhost/$name:$SUITE" -f "$dir/Containerfile" "$dir" >/dev/null
  echo "localhost/$name@$("$ENGINE" image inspect --format '{{.Digest}}' "localhost/$name:$SUITE")"
}

if [ "${1:-}" = "--lock" ]; then lock; exit 0; fi
wheelhouse
if [ -z "${BUILD_BASE:-}" ] || [ -z "${RUN_BASE:-}" ]; then
  command -v mmdebstrap >/dev/null || { echo "mmdebstrap is needed (or set BUILD_BASE and RUN_BASE)" >&2; exit 1; }
  BUILD_BASE=$(base gpugate-build-base python3,python3-venv)
  RUN_BASE=$(base gpugate-run-base python3,ca-certificates)
fi
"$ENGINE" build "${engine_flags[@]}" --format "$FORMAT" --omit-history --timestamp "$SOURCE_DATE_EPOCH" \
  --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" \
  --build-arg BUILD_BASE="$BUILD_BASE" --build-arg RUN_BASE="$RUN_BASE" \
  -f Containerfile -t "$TAG" .
echo "built $TAG on $RUN_BASE"
