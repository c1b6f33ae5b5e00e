"""The manifest.json beside each MDS folder: what was converted, with which tokenizer; reading that tokenizer."""
import hashlib
import json
import os

MANIFEST = 'manifest.json'


def file_sha256(path: str) -> str:
    with open(path, 'rb') as file:
        return hashlib.sha256(file.read()).hexdigest()


def read_manifest(folder: str) -> dict | None:
    """The folder's manifest, or None where there is none (e.g. shards made by another tool); ValueError naming
    the file if it is not JSON."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path) as file:
        try:
            return json.load(file)
        except json.JSONDecodeError as error:
            raise ValueError(f'{path}: not JSON ({error})') from None


def read_tokenizer(file: str):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json; ValueError naming the file if it is not one."""
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(file)
    except Exception as error:  # the Rust side raises a bare Exception
        raise ValueError(f'{file}: not a tokenizer.json the tokenizers library reads ({error})') from None
