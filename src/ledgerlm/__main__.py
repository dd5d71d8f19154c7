"""``python -m ledgerlm``: the CLI, also the entry ``torchrun -m ledgerlm`` starts per rank."""

from ledgerlm.cli.main import app

app()
