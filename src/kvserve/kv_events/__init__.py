"""KV-cache events over ZMQ in vLLM's schema: ``--kv-events-config``, the publisher each engine
runs, and the subscriber a router (or llm-d's indexer, or Dynamo's router) uses to follow a
worker's prefix cache.

    config.py      KVEventsConfig: vLLM's flag and JSON keys
    wire.py        vLLM's msgpack structs (KVEventBatch, BlockStored, BlockRemoved,
                   AllBlocksCleared) and the conversion from kvserve's typed events
    publisher.py   ZmqEventPublisher: PUB socket, sequence numbers, ROUTER replay window
    subscriber.py  KVEventSubscriber (SUB + replay on gaps) and WorkerBlockIndex (the rebuilt cache)
"""
