"""Fixtures shared by every tier; each tier's real services live in tests/fixtures/."""

pytest_plugins = [
    "tests.fixtures.db",
    "tests.fixtures.nvflare",
    "tests.fixtures.aws",
    "tests.fixtures.containers",
]
