#!/usr/bin/env bash
# Build the hostd .deb with Debian's own tooling (dpkg-buildpackage, debhelper, dh-virtualenv)
# from a copy of the repository, so the checkout stays clean. Needs network access to PyPI (the
# virtual environment bundles hostd's dependencies) and these Debian packages:
#   apt-get install --no-install-recommends debhelper dh-virtualenv python3-venv
# Usage: packaging/build-deb.sh [OUTDIR]   (default: dist/; prints the .deb's path last)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
out=$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/hostd/__init__.py")
[[ -n $version ]] || { echo "no __version__ in hostd/__init__.py" >&2; exit 2; }
# PEP 440 pre-releases sort before the release in Debian only with a tilde: 1.0rc1 -> 1.0~rc1.
debversion=$(sed -E 's/\.?(a|b|rc|dev)([0-9]+)$/~\1\2/' <<<"$version")-1

work=$(mktemp -d "${TMPDIR:-/tmp}/hostd-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/hostd-$version
"$here/export-tree.sh" "$src"
cp -a "$here/debian" "$src/debian"

# The changelog carries the version: write it from hostd.__version__ so they always agree.
when=$(git -C "$repo" log -1 --format=%cD 2>/dev/null || date -R)
cat >"$src/debian/changelog" <<CHANGELOG
hostd ($debversion) unstable; urgency=medium

  * hostd $version (built from the repository by packaging/build-deb.sh).

 -- hostd maintainers <hostd@localhost>  $when
CHANGELOG

# Debian's python3 and tools only: no pyenv shims, user venvs or PYTHON* overrides.
cd "$src"
env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    dpkg-buildpackage -b -us -uc
deb=$(ls "$work"/hostd_"$debversion"_*.deb)
cp "$deb" "$work"/*.buildinfo "$work"/*.changes "$out"/
echo "$out/$(basename "$deb")"
