"""sbatch --dependency and --constraint become the spec's dependencies, singleton and constraint (no warning)."""

from __future__ import annotations

import pytest
from oneplus_jobformats.errors import JobFormatError
from oneplus_jobformats.sbatch import parse_sbatch

SCRIPT = "#!/bin/bash\n#SBATCH --gpus=1\nsrun python train.py\n"


def test_dependencies_and_constraint_are_parsed() -> None:
    t = parse_sbatch(SCRIPT, ["--dependency=afterok:123:456,afterany:789", "-C", "a100|h100"])
    assert [(d.type, d.job_ids) for d in t.spec.dependencies] == [("afterok", ["123", "456"]), ("afterany", ["789"])]
    assert t.spec.constraint == "a100|h100" and not t.spec.singleton and not t.spec.dependency_any
    assert not any("dependency" in w or "constraint" in w for w in t.warnings)


def test_singleton_and_the_any_form_in_a_script() -> None:
    script = "#!/bin/bash\n#SBATCH --dependency=singleton\n#SBATCH --constraint=h100\n#SBATCH --gpus=1\nhostname\n"
    t = parse_sbatch(script)
    assert t.spec.singleton and t.spec.dependencies == [] and t.spec.constraint == "h100"
    t = parse_sbatch(SCRIPT, ["-d", "afternotok:j1?afterok:j2"])
    assert t.spec.dependency_any and [d.type for d in t.spec.dependencies] == ["afternotok", "afterok"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--dependency=aftercorr:1"], "aftercorr is for job arrays"),
        (["--dependency=afterburstbuffer:1"], "'afterburstbuffer' is not a dependency OnePlus supports"),
        (["--dependency=afterok"], "names no job id"),
        (["--dependency=after:1+10"], "delay"),
        (["--dependency=afterok:1,afterany:2?after:3"], "mixes"),
        (["--constraint=h100*2"], "node counts"),
        (["--constraint=[a|b]&c"], "whole expression"),
    ],
)
def test_what_is_not_supported_is_refused_clearly(args: list[str], says: str) -> None:
    with pytest.raises(JobFormatError) as err:
        parse_sbatch(SCRIPT, args)
    assert says in str(err.value)
