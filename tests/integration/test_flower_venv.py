"""The Flower virtualenv (`app.local.flower.ensure_flower_venv`) made from a hash-locked file, by
uv where the project's own venv has it and by pip where it does not (a demo installed without
uv): the locked package installed, the venv marked complete, a second call reusing it, and a
half-made one made again. A one-package lock keeps it to seconds; PyPI is reached as the test
command's own install reaches it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from app.local import flower

pytestmark = pytest.mark.integration

# One small pure package from .ci/flower.lock, with its hashes.
LOCK = """idna==3.20 \\
    --hash=sha256:a7db850025b95ded1eae8a46181a1a6c56c92c96f0e2b005d9ff8dc0210cab44 \\
    --hash=sha256:ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c
"""


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_the_venv_is_made_from_the_lock_once_and_a_half_made_one_again(
    installer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flower.tempfile, "gettempdir", lambda: str(tmp_path))
    if installer == "pip":
        monkeypatch.setattr(flower, "_uv", lambda: None)
    else:
        assert flower._uv() is not None, "the test command's venv holds uv"
    lock = tmp_path / "flower.lock"
    lock.write_text(f"# {installer}\n{LOCK}")

    venv = flower.ensure_flower_venv(lock)
    python = venv / "bin" / "python"
    shown = subprocess.run(
        [str(python), "-c", "import idna, sys; print(idna.__file__, sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(venv) in shown and flower.flower_venv_ready(lock)
    assert (venv / ".complete").read_text() == lock.read_text()
    made_by_uv = "\nuv = " in (venv / "pyvenv.cfg").read_text()
    assert made_by_uv is (installer == "uv")  # uv where it is: seconds, not pip's minute

    marker = venv / "made-once"
    marker.write_text("")
    assert flower.ensure_flower_venv(lock) == venv and marker.exists()  # reused, not made

    (venv / ".complete").unlink()  # a maker killed half-way
    assert flower.ensure_flower_venv(lock) == venv
    assert not marker.exists() and flower.flower_venv_ready(lock)
