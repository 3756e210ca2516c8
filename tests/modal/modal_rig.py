"""Where the Modal SDK fake and the reference function live, and the token the fake accepts."""

from pathlib import Path

FAKE = Path(__file__).parent / "fake_modal"
EXAMPLE = Path(__file__).parents[2] / "examples" / "modal_function.py"
TOKEN = ("ak-test", "as-test")
