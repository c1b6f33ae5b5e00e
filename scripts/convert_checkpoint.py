"""Convert weights between Composer checkpoints, HF Llama folders and our native folders.

  python scripts/convert_checkpoint.py to-hf <run-folder | checkpoint> <out-dir> [--dtype bfloat16] [--tokenizer DIR]
  python scripts/convert_checkpoint.py from-hf <hf-folder> <out-dir>      # then model.init_from: <out-dir>

Weights are written in safetensors files of at most --max-shard-size (default 5GB) with an index, as
transformers' save_pretrained writes them.
"""
import argparse
import sys

import torch

from llmfoundry_ext.checkpoint import export_to_hf
from llmfoundry_ext.cli import ArgumentParser, unwritable_reason
from llmfoundry_ext.errors import CheckpointError
from llmfoundry_ext.weights import MAX_SHARD_SIZE, import_from_hf


def shard_size(text: str) -> str:
    """A size such as 5GB or 500MB (huggingface_hub's units), checked before any weights are read."""
    from huggingface_hub import split_torch_state_dict_into_shards
    split_torch_state_dict_into_shards({}, max_shard_size=text)
    return text


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog='convert_checkpoint.py', description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest='command', required=True)
    to_hf = commands.add_parser('to-hf', help='Composer checkpoint -> HF safetensors folder')
    to_hf.add_argument('checkpoint', help="a run's save folder (its latest checkpoint) or one checkpoint")
    to_hf.add_argument('out')
    to_hf.add_argument('--dtype', default='bfloat16', choices=('bfloat16', 'float16', 'float32'))
    to_hf.add_argument('--tokenizer', help="tokenizer folder to include (default: the run's data.tokenizer)")
    from_hf = commands.add_parser('from-hf', help='HF Llama folder -> native folder for model.init_from')
    from_hf.add_argument('hf_folder')
    from_hf.add_argument('out')
    for command in (to_hf, from_hf):
        command.add_argument('--max-shard-size', type=shard_size, default=MAX_SHARD_SIZE,
                             help='largest safetensors file written, e.g. 5GB or 500MB (default %(default)s)')
    args = parser.parse_args(argv)
    try:
        if reason := unwritable_reason(args.out):
            raise CheckpointError(f'{args.out}: {reason}; choose an output folder you can write')
        if args.command == 'to-hf':
            checkpoint = export_to_hf(args.checkpoint, args.out, getattr(torch, args.dtype), args.tokenizer,
                                      args.max_shard_size)
            print(f'wrote {args.out} from {checkpoint}')
        else:
            config = import_from_hf(args.hf_folder, args.out, args.max_shard_size)
            print(f'wrote {args.out}: {config.num_params():,} parameters; use model.init_from={args.out}')
    except CheckpointError as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
