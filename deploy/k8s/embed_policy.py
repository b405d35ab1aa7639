"""Copy hostd's default policy into the ConfigMaps of the Kubernetes manifests in this folder.

``deploy/k8s/daemonset.yaml`` and ``sidecar.yaml`` carry the policy as a ``policy.toml: |``
block. Run ``python3 deploy/k8s/embed_policy.py`` after ``hostd/policy/training.toml`` changes;
``tests/packaging/test_k8s.py`` fails until the copies match.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLICY = HERE.parents[1] / "hostd" / "policy" / "training.toml"
MANIFESTS = ("daemonset.yaml", "sidecar.yaml")
# The block: the key line, then every following line that is indented deeper (or empty).
BLOCK = re.compile(r"^(?P<indent> *)policy\.toml: \|\n(?:(?:(?P=indent)  .*)?\n)*", re.MULTILINE)


def embed(text: str, policy: str) -> str:
    """``text`` with its ``policy.toml: |`` block replaced by ``policy``."""
    match = BLOCK.search(text)
    if match is None:
        raise ValueError("no 'policy.toml: |' block")
    pad = match["indent"] + "  "
    body = "".join(f"{pad}{line}\n" if line else "\n" for line in policy.splitlines())
    return text[: match.start()] + f"{match['indent']}policy.toml: |\n{body}" + text[match.end() :]


def main() -> int:
    policy = POLICY.read_text()
    for name in MANIFESTS:
        path = HERE / name
        text = path.read_text()
        new = embed(text, policy)
        if new != text:
            path.write_text(new)
            print(f"{path}: policy updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
