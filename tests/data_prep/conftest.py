"""A local S3 for the Stack-v2 tests."""
import os
import socket
import subprocess
import sys
import time

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


@pytest.fixture(scope='module')
def s3_endpoint():
    """A moto S3 server on 127.0.0.1 (a real HTTP endpoint: boto3 is not patched)."""
    port = free_port()
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), 'moto_server'), '-p', str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(('127.0.0.1', port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f'http://127.0.0.1:{port}'
    server.terminate()
    server.wait()
