#!/usr/bin/env bash
# Build the hostd .rpm with rpmbuild and packaging/rpm/hostd.spec from a copy of the repository.
# Needs rpmbuild (Debian: apt-get install rpm) and network access to PyPI. The package bundles a
# virtual environment built on $PYTHON (default: /usr/bin/python3, by its versioned name) and
# requires that same Python version on the target (python(abi) = X.Y).
# Usage: [PYTHON=/usr/bin/python3.11] packaging/build-rpm.sh [OUTDIR]   (default: dist/)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
out=$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/hostd/__init__.py")
[[ -n $version ]] || { echo "no __version__ in hostd/__init__.py" >&2; exit 2; }
# rpm versions may not contain "-"; PEP 440 pre-releases sort right with a tilde (1.0~rc1).
rpmversion=$(sed -E 's/\.?(a|b|rc|dev)([0-9]+)$/~\1\2/' <<<"$version")
python=${PYTHON:-/usr/bin/python3}
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
python=$(dirname "$python")/python$pyver
[[ -x $python ]] || { echo "$python not found" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/hostd-rpm.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$here/export-tree.sh" "$work/src"

# On a host that is not rpm-based (Debian), rpm's database knows none of the build
# requirements: do not check them there.
nodeps=()
rpm -q rpm >/dev/null 2>&1 || nodeps=(--nodeps)
env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    rpmbuild -bb "${nodeps[@]}" \
    --define "_topdir $work/rpmbuild" \
    --define "hostd_version $rpmversion" \
    --define "hostd_src $work/src" \
    --define "python $python" \
    "$here/rpm/hostd.spec"
rpm=$(ls "$work"/rpmbuild/RPMS/*/hostd-"$rpmversion"-1.*.rpm)
cp "$rpm" "$out"/
echo "$out/$(basename "$rpm")"
