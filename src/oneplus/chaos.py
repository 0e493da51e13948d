"""`python -m oneplus.chaos` (`task chaos`): runs `oneplus.testing.chaos` under its old name."""

from oneplus.testing.chaos import app

if __name__ == "__main__":
    app()
