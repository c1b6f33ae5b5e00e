"""Tokenizer files: the tokenizer.json of a tokenizer folder (HF's layout), read with HF ``tokenizers``."""
import os

from tokenizers import Tokenizer


def tokenizer_file(tokenizer: str) -> str:
    """A tokenizer folder or file -> its tokenizer.json."""
    return os.path.join(tokenizer, 'tokenizer.json') if os.path.isdir(tokenizer) else tokenizer


def read_tokenizer(file: str):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json; ValueError naming the file if it is not one."""
    try:
        return Tokenizer.from_file(file)
    except Exception as error:  # the Rust side raises a bare Exception
        raise ValueError(f'{file}: not a tokenizer.json the tokenizers library reads ({error})') from None
