"""pytest fixtures (loaded by tests/conftest.py). Filled in by the component that owns them."""
