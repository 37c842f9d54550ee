"""The ``transfer_queue`` section (veRL 0.9.1's TransferQueue data plane; not implemented by hybridflow,
refused when enabled)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, section

__all__ = [
    "TransferQueueMetricsConfig",
    "SimpleStorageConfig",
    "MooncakeStoreConfig",
    "TransferQueueBackendConfig",
    "TransferQueueConfig",
]


@dataclass
class TransferQueueMetricsConfig(BaseConfig):
    """``transfer_queue.metrics``."""

    enabled: bool = doc(False, "export the queue's metrics")
    port: int = doc(0, "metrics port (0: any)")


@dataclass
class SimpleStorageConfig(BaseConfig):
    """``transfer_queue.backend.SimpleStorage``."""

    total_storage_size: int = doc(100000, "samples the storage holds")
    num_data_storage_units: int = doc(8, "storage units")


@dataclass
class MooncakeStoreConfig(BaseConfig):
    """``transfer_queue.backend.MooncakeStore``."""

    auto_init: bool = doc(False, "start the store")
    metadata_server: str = doc("localhost:50123", "metadata server address")
    master_server_address: str = doc("localhost:50124", "master server address")
    local_hostname: str = doc("localhost", "this host's name")
    protocol: str = doc("tcp", "transfer protocol")
    global_segment_size: int = doc(4294967296, "bytes of the global segment")
    local_buffer_size: int = doc(1073741824, "bytes of the local buffer")
    device_name: str = doc("", "network device")


@dataclass
class TransferQueueBackendConfig(BaseConfig):
    """``transfer_queue.backend``."""

    storage_backend: str = doc("SimpleStorage", "SimpleStorage | MooncakeStore")
    SimpleStorage: SimpleStorageConfig = section(SimpleStorageConfig, "the in-memory storage")
    MooncakeStore: MooncakeStoreConfig = section(MooncakeStoreConfig, "the Mooncake store")


@dataclass
class TransferQueueConfig(BaseConfig):
    """``transfer_queue``: veRL's TransferQueue (not implemented)."""

    enable: bool = doc(False, "move batches through the TransferQueue")
    metrics: TransferQueueMetricsConfig = section(TransferQueueMetricsConfig, "its metrics")
    backend: TransferQueueBackendConfig = section(TransferQueueBackendConfig, "its storage")
