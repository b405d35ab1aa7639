#!/usr/bin/env bash
# Copy the repository's source (tracked files plus untracked ones git does not ignore, as they
# are in the working tree) into DEST, so builds never write into the checkout and never pick up
# build outputs, virtual environments or caches. Used by the build-*.sh scripts.
# Usage: packaging/export-tree.sh DEST
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:?usage: export-tree.sh DEST}
mkdir -p "$dest"
cd "$repo"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # Files deleted in the working tree but still in the index are left out.
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do
            if [[ -e $f || -L $f ]]; then printf '%s\0' "$f"; fi
        done |
        tar --null --no-recursion -T - -cf - | tar -C "$dest" -xf -
else
    # Not a git checkout (an unpacked source archive): everything but the usual outputs.
    tar --exclude=./.git --exclude=./.venv --exclude=./.cache --exclude=./dist \
        --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ -cf - . |
        tar -C "$dest" -xf -
fi
