"""`python -m oneplus.multihost` (`task multihost`): runs `oneplus.testing.multihost` under its old name."""

from oneplus.testing.multihost import app

if __name__ == "__main__":
    app()
