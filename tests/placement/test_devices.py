"""GPUs per model as a time-aware resource: counted, refused with reasons, planned for."""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement import Cluster, Host, PlacementEngine, Request, Resources, devices, refusals

MODELS = ("nvidia-a100", "nvidia-t4")
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def host(name, gpus, vcpus=64):
    return Host(name, Resources(vcpus, 262144, 4000, devices.gpus(gpus)))


def ask(gpus=None, start=0, end=3600, id="r", any_model=0):
    return Request(Resources(1, 1024, 10, devices.gpus(gpus or {})), start, end, id=id, gpus_any=any_model)


def in_use(allocations, name, t):
    return sum(
        a.resources.extras.get(name, 0) for a in allocations if a.start <= t < (math.inf if a.end is None else a.end)
    )


def never_more_than_the_host_has(engine):
    """At every instant an allocation starts, each host's devices of each model in use are at
    most what it has: a brute-force reference, no timeline involved."""
    for h in engine.snapshot().hosts:
        for name, have in h.total.extras.items():
            for t in {a.start for a in h.allocations}:
                assert in_use(h.allocations, name, t) <= have, (h.name, name, t)


def test_it_places_a_gpu_request_on_a_host_with_that_model():
    engine = PlacementEngine(Cluster((host("t4", {"nvidia-t4": 4}), host("a100", {"nvidia-a100": 2}))))
    result = engine.place(ask({"nvidia-a100": 2}))
    assert result.host == "a100"


def test_it_refuses_overlapping_gpus_with_the_reason_and_the_earliest_start():
    engine = PlacementEngine(Cluster((host("h1", {"nvidia-a100": 1}),)))
    engine.commit(engine.place(ask({"nvidia-a100": 1}, 0, 3600, id="first")))
    refused = engine.place(ask({"nvidia-a100": 1}, 1800, 5400, id="second"))
    assert not refused.ok
    assert refused.reasons == {refusals.lacks(devices.gpu("nvidia-a100")): 1}
    assert refused.earliest_fit.start == 3600
    text = refused.explained()
    assert "1 lack GPU nvidia-a100" in text
    assert "needs 1 GPU nvidia-a100 from 1970-01-01 00:30 to 01:30" not in text  # full dates
    assert "needs 1 GPU nvidia-a100 from 1970-01-01 00:30 to 1970-01-01 01:30, at most 0 free (on h1)" in text


def test_it_places_requests_that_do_not_overlap():
    engine = PlacementEngine(Cluster((host("h1", {"nvidia-a100": 1}),)))
    engine.commit(engine.place(ask({"nvidia-a100": 1}, 0, 3600, id="first")))
    assert engine.place(ask({"nvidia-a100": 1}, 3600, 7200, id="second")).host == "h1"


def test_a_model_no_host_has_is_explained():
    engine = PlacementEngine(Cluster((host("h1", {"nvidia-t4": 1}),)))
    result = engine.place(ask({"nvidia-h100": 1}))
    assert not result.ok
    assert "gpu:nvidia-h100" in result.note
    assert not result.earliest_fit.found


def test_any_model_takes_whichever_model_is_free_and_names_it():
    engine = PlacementEngine(Cluster((host("h1", {"nvidia-a100": 1, "nvidia-t4": 1}),)))
    first = engine.place(ask(any_model=1, id="a"))
    engine.commit(first)
    second = engine.place(ask(any_model=1, id="b"))
    engine.commit(second)
    models = {devices.model_of(n) for r in (first, second) for n in devices.asked(r.request)}
    assert models == {"nvidia-a100", "nvidia-t4"}
    third = engine.place(ask(any_model=1, id="c"))
    assert not third.ok
    assert "tried nvidia-a100, nvidia-t4" in third.note
    assert third.earliest_fit.start == 3600


def test_any_model_does_not_mix_models():
    engine = PlacementEngine(Cluster((host("h1", {"nvidia-a100": 1, "nvidia-t4": 1}),)))
    assert not engine.place(ask(any_model=2)).ok


def test_any_model_on_a_cluster_without_gpus_is_refused():
    engine = PlacementEngine(Cluster((host("h1", {}),)))
    result = engine.place(ask(any_model=1))
    assert not result.ok
    assert result.reasons == {"lacks_gpu:any": 1}
    assert not engine.earliest_fit(ask(any_model=1)).found


def test_a_request_without_gpus_still_goes_to_a_gpu_host_when_it_is_the_only_one():
    engine = PlacementEngine(Cluster((host("h1", {"nvidia-a100": 1}),)))
    assert engine.place(ask()).host == "h1"


def test_earliest_fit_waits_for_a_device():
    engine = PlacementEngine(Cluster((host("h1", {"nvidia-t4": 2}),)))
    for i, (start, end) in enumerate(((0, 1000), (500, 2000))):
        engine.commit(engine.place(ask({"nvidia-t4": 1}, start, end, id=f"a{i}")))
    assert engine.earliest_fit(ask({"nvidia-t4": 1}, 600, 1600)).start == 1000
    assert engine.earliest_fit(ask({"nvidia-t4": 2}, 600, 1600)).start == 2000
    assert engine.earliest_fit(ask(start=600, end=1600, any_model=2)).start == 2000


@st.composite
def gpu_hosts(draw):
    hosts = []
    for i in range(draw(st.integers(1, 4))):
        counts = {m: draw(st.integers(0, 3)) for m in MODELS}
        hosts.append(host(f"h{i}", counts, vcpus=draw(st.sampled_from([2, 64]))))
    return tuple(hosts)


@st.composite
def asks(draw):
    start = draw(st.integers(0, 30))
    end = draw(st.one_of(st.none(), st.integers(start + 1, 40)))
    count = draw(st.integers(1, 3))
    model = draw(st.sampled_from((None, *MODELS)))
    if model is None:
        return start, end, {}, count
    return start, end, {model: count}, 0


@SETTINGS
@given(gpu_hosts(), st.lists(asks(), max_size=12), st.lists(st.integers(0, 11), max_size=4))
def test_never_more_devices_of_a_model_in_use_than_a_host_has(hosts, sequence, removals):
    engine = PlacementEngine(Cluster(hosts))
    placed = []
    for i, (start, end, gpus, any_model) in enumerate(sequence):
        result = engine.place(ask(gpus, start, end, id=f"r{i}", any_model=any_model))
        if result.ok:
            placed.append(engine.commit(result).id)
            asked = devices.asked(result.request)
            assert sum(asked.values()) == (any_model or sum(gpus.values()))
            assert len(asked) == 1  # one model per VM
        else:
            fit = result.earliest_fit
            if fit is not None and fit.found:
                # the earliest fit is honest: placing there succeeds
                duration = None if end is None else end - start
                later = ask(
                    gpus, fit.start, None if duration is None else fit.start + duration, id=f"r{i}", any_model=any_model
                )
                assert engine.place(later).ok
        if i in removals and placed:
            engine.remove_allocation(placed.pop(0))
        never_more_than_the_host_has(engine)


def test_a_request_with_gpus_survives_serialisation():
    from placement import serialize

    request = ask({"nvidia-t4": 1}, any_model=0)
    assert serialize.request_from_dict(serialize.request_to_dict(request)) == request
    anyone = ask(any_model=2)
    assert serialize.request_from_dict(serialize.request_to_dict(anyone)).gpus_any == 2
