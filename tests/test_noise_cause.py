"""A noise warning names the likely cause its trials show, with the setting that addresses it:
other processes on the host (`host_interference`), or the server and truthput's client sharing
every core of the host (server CPU time + client CPU time ~ the host's cores); and says nothing
where the trials show neither (a negative control)."""

from __future__ import annotations

from truthput.analyze.noise import likely_noise_cause
from truthput.measure.model import Figure, SelfCheckFigures, TrialResults
from truthput.measure.validity import flag_window


def _trial(server: float, client: float, cores: int = 2, busy: bool = False) -> TrialResults:
    r = TrialResults()
    r.throughput.counter_window = Figure(value=100.0, unit="tok/s", source="server_counter")
    r.interference.host_cores = cores
    r.interference.server_cores = Figure(value=server, unit="cores", source="client_clock")
    r.client.selfcheck = SelfCheckFigures(cpu_util=client)
    if busy:
        flag_window(r, "host_interference", "other processes used 1.2 of 2 CPU cores")
    return r


def test_server_and_client_on_every_core_is_named_with_the_pinning_settings():
    said = likely_noise_cause([_trial(1.85, 0.20), _trial(1.9, 0.18)])
    assert said and "[server] cpus" in said and "[workload] client_cpus" in said and "all 2" in said, said


def test_other_processes_on_the_host_are_named_first():
    said = likely_noise_cause([_trial(0.5, 0.1, busy=True), _trial(0.5, 0.1)])
    assert said and "1 of 2 trials" in said and "host_interference" in said, said


def test_a_host_with_cores_to_spare_gets_no_guess():
    assert likely_noise_cause([_trial(0.9, 0.1, cores=4), _trial(1.0, 0.1, cores=4)]) is None
    assert likely_noise_cause([]) is None
