"""The manifest.json beside each MDS folder: what was converted, with which tokenizer."""
import hashlib
import json
import os

MANIFEST = 'manifest.json'


def file_sha256(path: str) -> str:
    with open(path, 'rb') as file:
        return hashlib.sha256(file.read()).hexdigest()


def read_manifest(folder: str) -> dict | None:
    """The folder's manifest, or None where there is none (e.g. shards made by another tool)."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path) as file:
        return json.load(file)
