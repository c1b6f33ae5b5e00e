"""Convert weights between Composer checkpoints, HF Llama folders and our native folders.

  python scripts/convert_checkpoint.py to-hf <run-folder | checkpoint> <out-dir> [--dtype bfloat16] [--tokenizer DIR]
  python scripts/convert_checkpoint.py from-hf <hf-folder> <out-dir>      # then model.init_from: <out-dir>
"""
import argparse
import sys

import torch

from llmfoundry_ext.checkpoint import CheckpointError, export_to_hf, import_from_hf


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest='command', required=True)
    to_hf = commands.add_parser('to-hf', help='Composer checkpoint -> HF safetensors folder')
    to_hf.add_argument('checkpoint', help="a run's save folder (its latest checkpoint) or one checkpoint")
    to_hf.add_argument('out')
    to_hf.add_argument('--dtype', default='bfloat16', choices=('bfloat16', 'float16', 'float32'))
    to_hf.add_argument('--tokenizer', help="tokenizer folder to include (default: the run's data.tokenizer)")
    from_hf = commands.add_parser('from-hf', help='HF Llama folder -> native folder for model.init_from')
    from_hf.add_argument('hf_folder')
    from_hf.add_argument('out')
    args = parser.parse_args(argv)
    try:
        if args.command == 'to-hf':
            checkpoint = export_to_hf(args.checkpoint, args.out, getattr(torch, args.dtype), args.tokenizer)
            print(f'wrote {args.out} from {checkpoint}')
        else:
            config = import_from_hf(args.hf_folder, args.out)
            print(f'wrote {args.out}: {config.num_params():,} parameters; use model.init_from={args.out}')
    except CheckpointError as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
