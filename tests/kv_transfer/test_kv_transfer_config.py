"""--kv-transfer-config (vLLM's JSON shape) and the short flags: what is accepted, and each
refusal naming the key, connector or flag."""

from __future__ import annotations

import json

import pytest

from kvserve.errors import ConfigError
from kvserve.kv_transfer.config import (DEFAULT_DISK_BYTES, DiskTierConfig, KVTransferConfig, PDConfig,
                                        kv_transfer_config_from_flags, kv_transfer_config_from_json)


def parse(value) -> KVTransferConfig:
    return kv_transfer_config_from_json(json.dumps(value))


def test_the_connectors_parse():
    assert parse({"kv_connector": "DiskConnector", "kv_role": "kv_both",
                  "kv_connector_extra_config": {"path": "/x", "max_bytes": 1024}}) == \
        KVTransferConfig(disk=DiskTierConfig("/x", 1024))
    assert parse({"kv_connector": "TcpConnector", "kv_role": "kv_producer", "kv_ip": "10.0.0.5", "kv_port": 7000}) == \
        KVTransferConfig(pd=PDConfig("producer", "10.0.0.5", 7000))
    consumer = parse({"kv_connector": "TcpConnector", "kv_role": "kv_consumer",
                      "kv_connector_extra_config": {"producers": ["10.0.0.5:14579"]}})
    assert consumer.pd.role == "consumer" and consumer.pd.producers == ("10.0.0.5:14579",)
    multi = parse({"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {
        "connectors": [{"kv_connector": "TcpConnector", "kv_connector_extra_config": {"producers": ["h:1"]}},
                       {"kv_connector": "DiskConnector", "kv_connector_extra_config": {"path": "/d"}}]}})
    assert multi == KVTransferConfig(disk=DiskTierConfig("/d", DEFAULT_DISK_BYTES),
                                     pd=PDConfig("consumer", producers=("h:1",)))
    assert kv_transfer_config_from_json(None) is None


@pytest.mark.parametrize("value,words", [
    ({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, "kv_connector 'NixlConnector' is not supported"),
    ({"kv_connector": "LMCacheConnectorV1"}, "kvserve's connectors: DiskConnector"),
    ({"kv_connector": "DiskConnector"}, "needs kv_connector_extra_config.path"),
    ({"kv_connector": "DiskConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"path": "/x"}},
     "kv_role must be kv_both"),
    ({"kv_connector": "DiskConnector", "kv_connector_extra_config": {"path": "/x", "max_bytes": 0}},
     "max_bytes must be an integer >= 1"),
    ({"kv_connector": "DiskConnector", "kv_connector_extra_config": {"path": "/x", "num_cpu_blocks": 9}},
     "unknown kv_connector_extra_config key 'num_cpu_blocks'"),
    ({"kv_connector": "TcpConnector"}, "kv_role must be kv_producer"),
    ({"kv_connector": "TcpConnector", "kv_role": "kv_producer", "kv_port": 70000}, "kv_port must be an integer"),
    ({"kv_connector": "TcpConnector", "kv_role": "kv_sender"}, "kv_role must be one of"),
    ({"kv_connector": "TcpConnector", "kv_role": "kv_producer", "kv_buffer_device": "cuda"},
     "kv_buffer_device is not supported"),
    ({"kv_connector": "TcpConnector", "kv_role": "kv_producer", "kv_load_failure_policy": "fail"},
     "kv_load_failure_policy 'fail' is not supported"),
    ({"kv_connector": "TcpConnector", "kv_role": "kv_producer", "colour": 1}, "unknown key 'colour'"),
    ({"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": []}}, "a list of connectors"),
    ({"kv_connector": "TcpConnector", "kv_role": "kv_consumer"}, "needs the block servers it may fetch from"),
    ({"kv_connector": "TcpConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"producers": "h:1"}},
     "producers must be a list"),
    ({"kv_connector": "TcpConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"producers": ["h"]}},
     "'h' is not HOST:PORT"),
    (["DiskConnector"], "must be a JSON object"),
])
def test_bad_configs_are_refused_by_name(value, words):
    with pytest.raises(ConfigError, match="--kv-transfer-config") as error:
        parse(value)
    assert words in str(error.value)


def test_not_json_is_refused():
    with pytest.raises(ConfigError, match="not valid JSON"):
        kv_transfer_config_from_json("{kv_connector")


def test_the_short_flags():
    assert kv_transfer_config_from_flags(None, "/d", 2.0, None, None, None) == \
        KVTransferConfig(disk=DiskTierConfig("/d", 2 << 30))
    assert kv_transfer_config_from_flags(None, None, None, "producer", 9000, "10.1.1.1") == \
        KVTransferConfig(pd=PDConfig("producer", "10.1.1.1", 9000))
    assert kv_transfer_config_from_flags(None, None, None, None, None, None) is None
    both = kv_transfer_config_from_flags(None, "/d", None, "consumer", None, None, ["127.0.0.1:9"])
    assert both.disk.path == "/d" and both.pd.role == "consumer"
    with pytest.raises(ConfigError, match="--kv-offload-size needs --kv-offload-dir"):
        kv_transfer_config_from_flags(None, None, 1.0, None, None, None)
    with pytest.raises(ConfigError, match="--kv-producers need --kv-role"):
        kv_transfer_config_from_flags(None, None, None, None, 9000, None)
    disk = KVTransferConfig(disk=DiskTierConfig("/x"))
    with pytest.raises(ConfigError, match="give the disk tier once"):
        kv_transfer_config_from_flags(disk, "/d", None, None, None, None)


@pytest.mark.parametrize("kwargs,words", [
    (dict(kv_offload_dir="/tmp/x", enable_prefix_caching=False), "it needs prefix caching"),
    (dict(kv_role="consumer", kv_producers=["h:1"], tensor_parallel_size=2), "-tp > 1 is not supported"),
    (dict(kv_role="consumer"), "--kv-producers HOST:PORT"),
    (dict(kv_role="producer", kv_port=70000), "--kv-port must be in 1..65535"),
    (dict(kv_transfer_config='{"kv_connector": "NixlConnector"}'), "kv_connector 'NixlConnector' is not supported"),
])
def test_engine_options_a_connector_cannot_work_with_are_refused_before_loading(kwargs, words):
    from kvserve.engine.arg_utils import engine_config_from_kwargs

    with pytest.raises(ConfigError) as error:
        engine_config_from_kwargs("/nonexistent-model", **kwargs)
    assert words in str(error.value)


def test_vllms_offloading_flags_make_a_host_tier():
    assert kv_transfer_config_from_flags(None, None, None, None, None, None, None, 2.0, "native") == \
        KVTransferConfig(host_bytes=2 << 30)
    with pytest.raises(ConfigError, match="--kv-offloading-backend lmcache is not supported"):
        kv_transfer_config_from_flags(None, None, None, None, None, None, None, 2.0, "lmcache")
    with pytest.raises(ConfigError, match="needs --kv-offloading-size"):
        kv_transfer_config_from_flags(None, None, None, None, None, None, None, None, "native")
