"""``python -m hostd``: the same CLI as the ``hostd`` console script."""

from hostd.cli import main

main()
