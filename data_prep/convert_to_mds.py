"""Convert a source to tokenized, packed MDS shards (uint32, zstd), in parallel and resumably.

  python data_prep/convert_to_mds.py --source finemath:finemath-3plus --input /data/finemath \\
      --tokenizer /models/llama3 --concat-tokens 8192 --out /lustre/mds/finemath-3plus --processes 32

Sources: zyda2:<component> (dclm_crossdeduped, fwe3, dolma-cc_crossdeduped-filtered, zyda_crossdeduped-filtered),
finemath:<config>, stack-v2 (smol-ids rows; contents from s3://softwareheritage, AWS credentials from the
environment), parquet:<glob>, jsonl:<glob>. --input is the folder `huggingface-cli download` filled;
without it, zyda2 and finemath stream from the hub.
Re-run the same command after an interruption: finished parts are kept, the others redone.
Across nodes: --nodes N --node-rank R (default: Slurm's array task or node of the job) converts input files R::N
into the same --out; the node that finds every part done writes the index and manifest (or --finalize, after).
"""
import argparse
import json
import os
import sys

from data_prep.convert import Job, convert, missing_parts, resolve_tokenizer, usable_cores
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
    parser.add_argument('--nodes', type=positive_int, help='nodes converting into --out (default: Slurm\'s, else 1)')
    parser.add_argument('--node-rank', type=int, help='this node, 0..nodes-1 (default: Slurm\'s, else 0)')
    parser.add_argument('--finalize', action='store_true', help='convert nothing: write the index and manifest '
                        'once every node\'s parts are done')
    args = parser.parse_args(argv)
    nodes, node_rank = node_placement(args.nodes, args.node_rank, os.environ)
    if not 0 <= node_rank < nodes:
        parser.error(f'--node-rank {node_rank} is not in 0..{nodes - 1} (--nodes {nodes})')
    try:
        if reason := unwritable_reason(args.out):
            raise SourceError(f'--out {args.out}: {reason}; choose a folder you can write')
        source = parse_source(args.source, args.input, args.text_column, args.id_column, args.s3_endpoint)
        tokenizer_file, eos, bos = resolve_tokenizer(args.tokenizer, args.out)
        job = Job(source, tokenizer_file, args.concat_tokens, args.val_fraction, args.out)
        manifest = convert(job, args.processes, args.eos_token or eos or '<|end_of_text|>',
                           bos if args.bos_token is None else (args.bos_token or None), args.max_docs,
                           {'source': args.source, 'input': args.input, 'max_docs': args.max_docs},
                           nodes=nodes, node_rank=None if args.finalize else node_rank)
        if manifest is None:
            missing = missing_parts(args.out)
            if args.finalize:
                raise SourceError(f'--finalize: {len(missing)} parts are not converted yet (of nodes '
                                  f'{", ".join(map(str, sorted({index % nodes for index in missing})))} of {nodes}); '
                                  f'run those nodes\' commands first')
            print(f'node {node_rank} of {nodes}: its parts are converted; {len(missing)} parts of other nodes are '
                  f'not yet: the last node to finish writes the index and manifest (or --finalize then)')
            return 0
    except SourceError as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    except OSError as error:  # what the checks above could not foresee (a disk filling up, a file vanishing)
        print(f'error: {error.filename or f"--out {args.out}"}: {error.strerror or error}; finished parts are kept: '
              f'fix it and run the same command again', file=sys.stderr)
        return 2
    if not any(manifest[split]['windows'] for split in ('train', 'val')):
        skipped = ', '.join(f'{count:,} {reason}' for reason, count in manifest['skipped'].items()) or 'none'
        print(f"error: {args.source}: no document made a window of {args.concat_tokens:,} tokens (documents "
              f"skipped: {skipped}); check the input files and --text-column", file=sys.stderr)
        return 2
    print(json.dumps({split: manifest[split] for split in ('train', 'val')} | {'skipped': manifest['skipped']}))
    return 0


def node_placement(nodes: int | None, node_rank: int | None, environment: dict) -> tuple[int, int]:
    """(nodes, this node's rank): as given, else a Slurm array job's task count and index, else a Slurm job's node
    count and node, else one node."""
    if 'SLURM_ARRAY_TASK_COUNT' in environment:
        slurm = (int(environment['SLURM_ARRAY_TASK_COUNT']),
                 int(environment['SLURM_ARRAY_TASK_ID']) - int(environment.get('SLURM_ARRAY_TASK_MIN', 0)))
    elif 'SLURM_NNODES' in environment:
        slurm = int(environment['SLURM_NNODES']), int(environment.get('SLURM_NODEID', 0))
    else:
        slurm = 1, 0
    return nodes or slurm[0], slurm[1] if node_rank is None else node_rank


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
