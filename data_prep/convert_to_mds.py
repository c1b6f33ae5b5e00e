"""Convert a source to tokenized, packed MDS shards (uint32, zstd), in parallel and resumably.

  python data_prep/convert_to_mds.py --source finemath:finemath-3plus --input /data/finemath \\
      --tokenizer /models/llama3 --concat-tokens 8192 --out /lustre/mds/finemath-3plus --processes 32

Sources: zyda2:<component> (dclm_crossdeduped, fwe3, dolma-cc_crossdeduped-filtered, zyda_crossdeduped-filtered),
finemath:<config>, stack-v2 (smol-ids rows; contents from s3://softwareheritage, AWS credentials from the
environment), parquet:<glob>, jsonl:<glob>. --input is the folder `huggingface-cli download` filled;
without it, zyda2 and finemath stream from the hub.
Re-run the same command after an interruption: finished parts are kept, the others redone.
"""
import argparse
import json
import sys

from data_prep.convert import Job, convert, resolve_tokenizer, usable_cores
from data_prep.sources import SourceError, parse_source
from llmfoundry_ext.cli import ArgumentParser, fraction, positive_int, unwritable_reason


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog='convert_to_mds.py', description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--source', required=True)
    parser.add_argument('--input', help='local folder of the dataset (zyda2, finemath, stack-v2)')
    parser.add_argument('--tokenizer', required=True, help='tokenizer.json, a folder with one, or an HF name')
    parser.add_argument('--concat-tokens', type=positive_int, required=True, help='tokens per packed window')
    parser.add_argument('--out', required=True)
    parser.add_argument('--processes', type=positive_int, default=usable_cores())
    parser.add_argument('--val-fraction', type=fraction, default=0.0, help='documents held out, by a hash of their id')
    parser.add_argument('--max-docs', type=positive_int, help='at most this many documents from each input file')
    parser.add_argument('--text-column', default='text')
    parser.add_argument('--id-column')
    parser.add_argument('--eos-token', help="default: the tokenizer's own, else <|end_of_text|>")
    parser.add_argument('--bos-token', help="default: the tokenizer's own; '' for none")
    parser.add_argument('--s3-endpoint', help='an S3-compatible endpoint for stack-v2 contents')
    args = parser.parse_args(argv)
    try:
        if reason := unwritable_reason(args.out):
            raise SourceError(f'--out {args.out}: {reason}; choose a folder you can write')
        source = parse_source(args.source, args.input, args.text_column, args.id_column, args.s3_endpoint)
        tokenizer_file, eos, bos = resolve_tokenizer(args.tokenizer, args.out)
        job = Job(source, tokenizer_file, args.concat_tokens, args.val_fraction, args.out)
        manifest = convert(job, args.processes, args.eos_token or eos or '<|end_of_text|>',
                           bos if args.bos_token is None else (args.bos_token or None), args.max_docs,
                           {'source': args.source, 'input': args.input, 'max_docs': args.max_docs})
    except SourceError as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    except OSError as error:  # what the checks above could not foresee (a disk filling up, a file vanishing)
        print(f'error: {error.filename or ""}: {error.strerror or error}; finished parts are kept: fix it and run the '
              f'same command again', file=sys.stderr)
        return 2
    print(json.dumps({split: manifest[split] for split in ('train', 'val')} | {'skipped': manifest['skipped']}))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
