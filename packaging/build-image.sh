#!/usr/bin/env bash
# Build hostd's container image with buildah from a copy of the repository.
# Needs buildah (Debian: apt-get install buildah), a registry with the base image (Docker Hub's
# debian:12-slim by default; BASE=... names another) and network access to Debian's mirrors
# and PyPI. Extra arguments go to `buildah bud` (e.g. --storage-driver vfs --isolation chroot,
# which work where overlay and OCI runtimes do not).
# Usage: [BASE=image] [TAG=hostd:VERSION] [PIP_CERT=ca.pem] packaging/build-image.sh [bud options]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/hostd/__init__.py")
tag=${TAG:-localhost/hostd:$version}

work=$(mktemp -d "${TMPDIR:-/tmp}/hostd-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$here/export-tree.sh" "$work/src"
buildargs=()
if [[ -n ${BASE:-} ]]; then buildargs+=(--build-arg "BASE=$BASE"); fi
# Behind a TLS-intercepting proxy pip needs its CA bundle (PIP_CERT, as pip reads it).
if [[ -n ${PIP_CERT:-} && -f $PIP_CERT ]]; then
    buildargs+=(-v "$PIP_CERT:/run/hostd-build-ca.crt:ro" --build-arg PIP_CERT=/run/hostd-build-ca.crt)
fi
buildah bud "$@" "${buildargs[@]}" --layers=false \
    --label "org.opencontainers.image.version=$version" \
    -f "$work/src/packaging/container/Containerfile" -t "$tag" "$work/src"
echo "$tag"
