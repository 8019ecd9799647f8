"""The `harness` command: thin wrappers, each a call into a module that tests can call directly.

One module per stage holds that stage's commands; importing it registers them on `app`, so the
import order below is the order of `harness --help`:
predict → observe → inventory → measure → launch → analysis → search → dev.
"""

# isort: off
from harness.cli.app import app
from harness.cli import predict, observe, inventory, measure, launch, analysis, search, dev

# isort: on

STAGE_COMMANDS = (predict, observe, inventory, measure, launch, analysis, search, dev)

__all__ = ["STAGE_COMMANDS", "app"]
