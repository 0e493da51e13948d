"""`--array` in sbatch scripts and on the command line, the site's max_array_size, and the dry run's `array` key."""

from __future__ import annotations

import pytest
from oneplus_jobformats import JobFormatError, dry_run_summary, load_job_document
from oneplus_jobformats.sbatch import parse_sbatch
from oneplus_jobformats.site import SiteMap, SiteMapError, load_site

SCRIPT = "#!/bin/bash\n#SBATCH --gpus=1\n#SBATCH --array=0-999%50\n#SBATCH -o logs/%A_%a.out\npython sweep.py\n"


def test_the_directive_the_command_line_and_the_dry_run() -> None:
    tr = parse_sbatch(SCRIPT)
    assert tr.spec.array is not None and (tr.spec.array.indices, tr.spec.array.max_running) == ("0-999", 50)
    assert dry_run_summary(tr.spec, tr.warnings, kind=tr.kind)["array"] == {
        "tasks": 1000,
        "max_running": 50,
        "indices": "0-999",
    }
    # The command line overrides the script; -a is the short form.
    again = parse_sbatch(SCRIPT, ["-a", "1,3,5-9:2"]).spec.array
    assert again is not None and list(again.task_ids) == [1, 3, 5, 7, 9] and again.max_running is None
    plain = parse_sbatch("#!/bin/bash\n#SBATCH --gpus=1\nhostname\n")
    assert dry_run_summary(plain.spec, plain.warnings)["array"] is None


def test_a_native_spec_takes_array_in_both_forms() -> None:
    text = 'name: sweep\nresources: {gpus: 1}\narray: "0-9%2"\n'
    spec = load_job_document(text, filename="sweep.yaml").spec
    assert spec.array is not None and (spec.array.tasks, spec.array.max_running) == (10, 2)
    text = "name: sweep\nresources: {gpus: 1}\narray: {indices: '1-7:2', max_running: 3}\n"
    spec = load_job_document(text, filename="sweep.yaml").spec
    assert spec.array is not None and list(spec.array.task_ids) == [1, 3, 5, 7]
    with pytest.raises(JobFormatError, match=r"sweep.yaml: .*array.*the range ends \(1\) before it starts \(5\)"):
        load_job_document("name: s\nresources: {gpus: 1}\narray: 5-1\n", filename="sweep.yaml")


def test_the_sites_max_array_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(JobFormatError, match="task id 5000 is above the site's max_array_size"):
        parse_sbatch(SCRIPT, ["--array=0-5000"], filename="job.sh")
    spec = parse_sbatch(SCRIPT, ["--array=0-5000"], site=SiteMap(max_array_size=10_001)).spec
    assert spec.array is not None and spec.array.tasks == 5001
    site = tmp_path / "site.yaml"
    site.write_text("max_array_size: 0\n")
    with pytest.raises(SiteMapError, match="max_array_size"):
        load_site(site)


def test_squeue_shows_an_arrays_pending_tasks_as_one_row() -> None:
    import time

    from oneplus_contracts import JobRecord
    from oneplus_contracts.array_facts import task_specs
    from oneplus_jobformats.slurm_tables import fold_pending_tasks

    spec = parse_sbatch(SCRIPT, ["--array=0-9%4"]).spec
    now = time.time()
    recs = [
        JobRecord(job_id=j, spec=s, state="ACCEPTED", submitted_ts=now, updated_ts=now)
        for j, s in task_specs("j-a", spec)
    ]
    recs[2] = recs[2].model_copy(update={"state": "RUNNING"})
    kept, names = fold_pending_tasks(recs)
    assert [r.job_id for r in kept] == ["j-a_0", "j-a_2"]
    assert names == {"j-a_0": "j-a_[0-1,3-9%4]"}
