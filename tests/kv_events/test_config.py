import pytest

from kvserve.errors import ConfigError
from kvserve.kv_events.config import KVEventsConfig, kv_events_config_from_json, offset_endpoint_port


def test_vllm_defaults_and_publisher_rule():
    # vLLM's KVEventsConfig: publisher defaults to zmq when enabled, else null
    assert KVEventsConfig().publisher == "null" and not KVEventsConfig().publishes
    config = kv_events_config_from_json('{"enable_kv_cache_events": true}')
    assert (config.publisher, config.endpoint, config.replay_endpoint, config.buffer_steps, config.hwm,
            config.max_queue_size, config.topic) == ("zmq", "tcp://*:5557", None, 10_000, 100_000, 100_000, "")
    assert config.publishes
    assert not kv_events_config_from_json('{"enable_kv_cache_events": true, "publisher": "null"}').publishes


def test_rank_offsets_ports_as_vllm():
    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint_port("inproc://cache", 1) == "inproc://cache_dp1"
    config = KVEventsConfig(True, endpoint="tcp://*:6000", replay_endpoint="tcp://*:6100").for_rank(3)
    assert (config.endpoint, config.replay_endpoint) == ("tcp://*:6003", "tcp://*:6103")


@pytest.mark.parametrize("text, words", [
    ("[1]", "must be a JSON object"), ("{", "must be a JSON object"),
    ('{"enable_kv_cache_events": true, "endpont": "x"}', "unknown key 'endpont'"),
    ('{"publisher": "kafka"}', "publisher must be 'zmq' or 'null'"),
    ('{"buffer_steps": 0}', "buffer_steps must be an integer >= 1"),
])
def test_bad_configs_name_the_key(text, words):
    with pytest.raises(ConfigError, match=words):
        kv_events_config_from_json(text)


def test_data_parallel_is_refused_offline():
    from kvserve.engine.arg_utils import engine_config_from_kwargs

    with pytest.raises(ValueError, match="only kvserve serve"):
        engine_config_from_kwargs("unused", data_parallel_size=2)
