"""Shared storage for the cluster tier: moto's S3 server on the bridge, reached by every host.

The server runs in the driver's process, bound to the bridge's address (198.18.<net>.1), which
every host routes to; nothing listens anywhere else. Ranks find it the way users point boto at
any S3-compatible store: ``AWS_ENDPOINT_URL`` and credentials in their environment
(:attr:`SharedS3.env`, given to ``SparkRunner(env=...)``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Iterator
from typing import Any

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclasses.dataclass
class SharedS3:
    """A running S3 endpoint and how to reach it.

    Attributes:
        endpoint: ``http://ADDRESS:PORT`` of the server.
    """

    endpoint: str

    @property
    def env(self) -> dict[str, str]:
        """The environment a rank needs to reach the endpoint through s3fs / boto."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec options that reach the endpoint from this process, whatever its env."""
        return {
            "key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": self.endpoint},
        }

    def fs(self) -> Any:
        """A fresh s3fs file system on the endpoint (no listing cache from earlier calls)."""
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)
        fs.invalidate_cache()
        return fs

    def new_bucket(self, prefix: str) -> str:
        """Make a bucket of its own for one test; returns its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.fs().mkdir(name)
        return name


@contextlib.contextmanager
def shared_s3(address: str) -> Iterator[SharedS3]:
    """moto's S3 server on ``address`` (a free port), stopped when the block ends."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO: hundreds of lines per checkpointed run.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=address, port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield SharedS3(endpoint=f"http://{host}:{port}")
    finally:
        server.stop()
