"""The heartbeat's per-GPU health on an NVML node: re-read, folded into the topology, sent at once when it changes."""

from __future__ import annotations

from executor_fakes import executor
from fake_pynvml import make_fake_pynvml
from oneplus_node_executor.gpu_health import fold_probe, health_changes
from oneplus_node_executor.runtime.simulated import SimulatedRuntime
from oneplus_topology.nvml import discover_node
from oneplus_topology.presets import load_preset

PRESET = "h100_sxm_8gpu_nvswitch_nv18"


def probe_of(**faults: object):  # type: ignore[no-untyped-def]
    fake = make_fake_pynvml(load_preset(PRESET, "unit-0"), **faults)  # type: ignore[arg-type]
    return lambda: discover_node("unit-0", fake)


async def test_a_gpu_that_goes_bad_is_reported_unhealthy_in_the_next_heartbeat_and_healthy_once_it_recovers() -> None:
    ex, svc, _ = executor(SimulatedRuntime())
    ex.topology = discover_node("unit-0", make_fake_pynvml(load_preset(PRESET, "unit-0")))
    ex.gpu_probe = probe_of(ecc_uncorrected={2: 5}, down_links={5: 4})
    await ex.check_gpus()
    (hb,) = svc.nc.heartbeats()
    by_index = {g.index: g for g in hb.gpus}
    assert not by_index[2].healthy and by_index[2].reason == "5 uncorrected ECC errors since the last driver load"
    assert by_index[5].healthy and by_index[5].nvlinks_active == 14  # 18 NVLinks, 4 of them down
    assert all(g.healthy and g.nvlinks_active == 18 for i, g in by_index.items() if i not in (2, 5))

    await ex.check_gpus()
    assert len(svc.nc.heartbeats()) == 1, "no change, no extra heartbeat"
    ex.gpu_probe = probe_of()
    await ex.check_gpus()
    assert all(g.healthy and g.nvlinks_active == 18 for g in svc.nc.heartbeats()[-1].gpus)


async def test_nvml_that_cannot_be_read_makes_every_gpu_unhealthy_with_the_reason() -> None:
    ex, svc, _ = executor(SimulatedRuntime())
    ex.gpu_probe = lambda: discover_node("unit-0", make_fake_pynvml(load_preset(PRESET, "unit-0"), driver=False))
    await ex.check_gpus()
    (hb,) = svc.nc.heartbeats()
    assert not any(g.healthy for g in hb.gpus)
    assert hb.gpus[0].reason is not None and hb.gpus[0].reason.startswith(
        "GPU health cannot be read: NVML cannot start"
    )


def test_a_gpu_the_probe_no_longer_lists_is_unhealthy_and_the_change_is_named() -> None:
    before = load_preset(PRESET, "n")
    probed = before.model_copy(update={"gpus": before.gpus[:7]})
    after = fold_probe(before, probed)
    assert not after.gpus[7].healthy and after.gpus[7].health_reason == "NVML no longer lists this GPU"
    assert health_changes(before, after) == ["GPU 7 unhealthy: NVML no longer lists this GPU"]
