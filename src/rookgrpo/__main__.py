"""``python -m rookgrpo RECIPE.yaml [--field value ...]``: train from a recipe (what ``accelerate launch -m rookgrpo`` runs)."""

import sys

from .cli import run_module

if __name__ == "__main__":
    sys.exit(run_module(sys.argv[1:]))
