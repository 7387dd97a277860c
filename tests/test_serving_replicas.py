"""The Ray Serve deployment's own logic, without Ray: options from the command line, deployment arguments, the
replica's health check through the app's lifespan, and the replica header and metrics label on a live server."""

from __future__ import annotations

import argparse

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving_helpers import running_server, tts_checkpoint
from uvicorn.config import Config
from uvicorn.lifespan.on import LifespanOn
from websockets.sync.client import connect

from omni_stream.realtime import ray_serve, server
from omni_stream.realtime.ray_serve import EngineSpec, OmniReplica, RayOptions, deployment_options, probe, shortfall
from omni_stream.realtime.replica import HEADER
from omni_stream.realtime.settings import Settings

pytest_plugins = ("serving_fixtures",)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    return parser.parse_args(argv)


def test_ray_options_come_from_the_serve_flags():
    args = parse("--ray", "--replicas", "3", "--max-concurrency", "8", "--device", "cuda", "--port", "9000")
    opts = ray_serve.options_from_args(args)
    assert opts == RayOptions(
        port=9000, replicas=3, gpus_per_replica=1.0, max_ongoing_requests=8, max_queued_requests=8
    )
    assert server.settings_from_args(args).pace_streams_seconds == 2.0  # paced behind Ray's proxy by default
    cpu = ray_serve.options_from_args(parse("--ray", "--autoscale", "1:4", "--max-queued-requests", "0"))
    assert cpu.gpus_per_replica == 0.0 and cpu.autoscale == (1, 4) and cpu.max_queued_requests == 0
    llm = {"llm": "/lm", "llm_family": "vllm", "backend_args": {"tensor_parallel_size": 2}}
    assert ray_serve.engine_from_args(args, ["/ckpt"], llm) == EngineSpec(
        models=("/ckpt",), llm=tuple(llm.items()), device="cuda", dtype=None, load_format="auto", max_batch_size=8
    )


def test_pacing_flag():
    assert server.settings_from_args(parse()).pace_streams_seconds is None  # one process: TCP backpressure
    assert server.settings_from_args(parse("--ray", "--pace-streams", "off")).pace_streams_seconds is None
    assert server.settings_from_args(parse("--pace-streams", "0.5")).pace_streams_seconds == 0.5


@pytest.mark.parametrize(
    "argv",
    [("--replicas", "2", "--autoscale", "1:2"), ("--autoscale", "3:1"), ("--autoscale", "0:0"), ("--autoscale", "x")],
)
def test_bad_scale_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parse("--ray", *argv)
    with pytest.raises(SystemExit):
        parse("--pace-streams", "-1")


def test_ray_flags_without_ray_are_refused(capsys):
    assert server.run(parse("--replicas", "2")) == 2
    assert "need --ray" in capsys.readouterr().err


def test_deployment_arguments():
    fixed = deployment_options(RayOptions(replicas=2, gpus_per_replica=1.0, max_ongoing_requests=16))
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert fixed["max_ongoing_requests"] == 16  # not Ray's default of 5
    assert fixed["backpressure_config"] == {"status_code": 429, "retry_after_s": 1.0}
    scaled = deployment_options(RayOptions(autoscale=(0, 4), max_ongoing_requests=10))
    assert "num_replicas" not in scaled
    assert scaled["autoscaling_config"] == {
        "min_replicas": 0,
        "initial_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 7.0,
    }
    with pytest.raises(ValueError):
        RayOptions(autoscale=(2, 1))


def test_shortfall_names_what_the_cluster_lacks():
    assert shortfall(RayOptions(replicas=2, gpus_per_replica=1.0), {"CPU": 16.0, "GPU": 2.0}) is None
    assert shortfall(RayOptions(replicas=3, gpus_per_replica=1.0), {"CPU": 16.0, "GPU": 2.0}) == (
        "3 replica(s) need 3 GPU, the cluster has 2"
    )
    assert "CPU" in shortfall(RayOptions(replicas=4, cpus_per_replica=1.0), {"CPU": 2.0})


async def test_the_health_check_follows_the_apps_lifespan():
    """Ray runs the ASGI lifespan with uvicorn's LifespanOn, then calls check_health: the same path here."""
    replica = OmniReplica(EngineSpec(models=(str(tts_checkpoint()),)), Settings(), replica_id="r1")
    with pytest.raises(RuntimeError, match="not built"):
        await replica.check_health()
    app = replica.__serve_build_asgi_app__()
    with pytest.raises(RuntimeError, match="503"):  # built, the engine not loaded yet
        await replica.check_health()
    lifespan = LifespanOn(Config(app, lifespan="on"))
    await lifespan.startup()
    try:
        await replica.check_health()
        assert await probe(app, "/v1/models") == 200
        assert app.state.omni.settings.replica_id == "r1"
    finally:
        await lifespan.shutdown()
    with pytest.raises(RuntimeError, match="503"):  # the engine is closed
        await replica.check_health()


def test_replica_header_and_metrics_label():
    with running_server(tts_checkpoint(), Settings(replica_id="replica-7")) as live:
        with httpx.Client(base_url=live.url, timeout=30) as c:
            assert c.get("/health").headers[HEADER] == "replica-7"
            speech = c.post("/v1/audio/speech", json={"input": "hi", "voice": "vivian", "response_format": "pcm"})
            assert speech.headers[HEADER] == "replica-7"
            assert c.post("/v1/audio/speech", json={}).headers[HEADER] == "replica-7"  # errors too
            samples = [s for f in text_string_to_metric_families(c.get("/metrics").text) for s in f.samples]
        assert {s.name for s in samples} >= {"omni_stream_requests_running", "omni_stream_http_requests_total"}
        assert all(s.labels["replica"] == "replica-7" for s in samples)
        with connect(f"{live.ws_url}/v1/audio/speech/stream") as ws:
            assert ws.response.headers[HEADER] == "replica-7"


def test_no_replica_header_by_default(live_server):
    with httpx.Client(base_url=live_server.url, timeout=30) as c:
        r = c.get("/health")
        assert HEADER not in r.headers
        assert 'replica="' not in c.get("/metrics").text
