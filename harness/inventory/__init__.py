"""The frozen, token-counted prompt inventory: its recipe, its build, and the checks that it is what it says."""
