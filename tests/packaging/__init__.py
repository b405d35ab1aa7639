"""Packaging tier: the deb, the rpm, the systemd unit, the container image, Kubernetes."""
