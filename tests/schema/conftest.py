"""The serve fixtures, for validating what a real server answers."""

from tests.serve.conftest import start_server  # noqa: F401
