"""``python -m routetune``: the same as the ``routetune`` command."""

from routetune.cli import main

main()
