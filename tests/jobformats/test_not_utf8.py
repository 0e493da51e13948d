"""A job file that is not UTF-8 is refused with one line naming the file, the line and the byte (issue 13, item 5),
by `oneplus submit -f` and by `oneplus sbatch`, never with a UnicodeDecodeError traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from oneplus_jobformats.errors import JobFormatError
from oneplus_jobformats.text import decode_document
from typer.testing import CliRunner

from oneplus.cli.app import app as main_app
from oneplus.cli.slurm import app as slurm_app

LATIN1_SCRIPT = "#!/bin/bash\n#SBATCH --job-name=caf\xe9\nsrun hostname\n".encode("latin-1")
UTF16_YAML = "name: x\nresources: {gpus: 1}\n".encode("utf-16")


def test_decode_names_line_offset_and_byte() -> None:
    with pytest.raises(JobFormatError) as exc:
        decode_document(LATIN1_SCRIPT, filename="job.sh")
    text = str(exc.value)
    assert text.startswith("job.sh: line 2: is not UTF-8 text: byte 0xe9 at offset 34")
    assert "\n" not in text


def test_utf16_is_named() -> None:
    with pytest.raises(JobFormatError, match="looks like UTF-16"):
        decode_document(UTF16_YAML, filename="job.yaml")


def test_utf8_with_bom_is_text() -> None:
    assert decode_document("\ufeffname: x".encode(), filename="f") == "name: x"


@pytest.mark.parametrize("data", [LATIN1_SCRIPT, UTF16_YAML])
def test_submit_dry_run_gives_one_line_and_exit_2(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    result = CliRunner().invoke(main_app, ["submit", "-f", str(path), "--dry-run", "--json"])
    assert result.exit_code == 2, result.output
    assert "is not UTF-8 text" in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_sbatch_file_and_stdin_give_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_bytes(LATIN1_SCRIPT)
    result = CliRunner().invoke(slurm_app, ["sbatch", str(path), "--dry-run"])
    assert result.exit_code == 2
    assert f"sbatch: error: {path}: line 2: is not UTF-8 text" in result.output
    piped = CliRunner().invoke(slurm_app, ["sbatch", "--dry-run"], input=LATIN1_SCRIPT)
    assert piped.exit_code == 2
    assert "sbatch: error: <stdin>: line 2: is not UTF-8 text" in piped.output


def test_missing_file_is_still_reported(tmp_path: Path) -> None:
    result = CliRunner().invoke(main_app, ["submit", "-f", str(tmp_path / "none.yaml"), "--dry-run"])
    assert result.exit_code == 2
    assert "cannot read" in result.output
