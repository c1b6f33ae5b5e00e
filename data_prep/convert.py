"""Raw documents -> tokenized, packed MDS shards, in parallel parts, resumably.

Each input file is one part, converted by one worker into ``<out>/<split>/part-NNNNN/`` (written as
``.partial`` and renamed when complete, with its ``part.json``). A re-run skips finished parts and redoes
unfinished ones, so an interrupted conversion ends with the same token stream as an uninterrupted one.
``<out>/<split>/index.json`` (merged over the parts, in part order) and ``<out>/manifest.json`` are written last,
once every part exists. Across nodes, node R of N converts parts R, R + N, ... into the same output folder; whichever
node finds every part done writes the index and manifest (the same bytes from any node), so a half-converted output
has no index and is never read as complete.
"""
import functools
import hashlib
import itertools
import json
import multiprocessing
import os
import socket
import time
import urllib.parse
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from dataclasses import dataclass

from data_prep.packing import Packer, tokenize_documents
from data_prep.sources import Counts, SourceError
from llmfoundry_ext.atomic import atomic_folder, write_atomically
from llmfoundry_ext.data.mds import MANIFEST, ShardWriter, file_sha256
from llmfoundry_ext.tokenizer import read_tokenizer, tokenizer_file

SPLITS = ('train', 'val')


@dataclass(frozen=True)
class Job:
    """What every part of one conversion shares (picklable, sent to the workers)."""
    source: object           # a data_prep.sources reader spec with .files() and .documents(file, counts)
    tokenizer_file: str
    window: int
    val_fraction: float
    out: str


def in_validation(document_id: str, fraction: float) -> bool:
    """A stable hash of the id decides the split, whatever the order or the number of workers."""
    digest = hashlib.sha256(document_id.encode('utf-8')).digest()
    return int.from_bytes(digest[:8], 'big') / 2 ** 64 < fraction


def part_folder(out: str, split: str, index: int) -> str:
    return os.path.join(out, split, f'part-{index:05d}')


def part_done(out: str, index: int) -> bool:
    return all(os.path.isfile(os.path.join(part_folder(out, split, index), 'part.json')) for split in SPLITS)


def special_ids(tokenizer, eos_token: str | None, bos_token: str | None) -> tuple[int, int | None]:
    """EOS id (required) and BOS id (optional) of a ``tokenizers.Tokenizer``."""
    eos = tokenizer.token_to_id(eos_token) if eos_token else None
    if eos is None:
        raise SourceError(f'the tokenizer has no EOS token {eos_token!r}: pass --eos-token with one it has '
                          f'(documents must be separated)')
    bos = tokenizer.token_to_id(bos_token) if bos_token else None
    if bos_token and bos is None:
        raise SourceError(f'the tokenizer has no BOS token {bos_token!r}: pass --bos-token "" to add none')
    return eos, bos


def convert_part(job: Job, index: int, file: str, eos_token: str, bos_token: str | None,
                 max_docs: int | None = None) -> dict:
    """Tokenize one input file into its train and val part folders; returns its part.json record."""
    tokenizer = worker_tokenizer(job.tokenizer_file)
    eos, bos = special_ids(tokenizer, eos_token, bos_token)
    counts = Counts()
    record = {'file': file, 'documents': {s: 0 for s in SPLITS}, 'windows': {s: 0 for s in SPLITS},
              'tail_tokens': {}}
    with ExitStack() as stack:
        folders = {s: stack.enter_context(atomic_folder(part_folder(job.out, s, index))) for s in SPLITS}
        writers = {s: ShardWriter(folders[s]) for s in SPLITS}
        packers = {s: Packer(job.window) for s in SPLITS}
        documents = job.source.documents(file, counts)
        for document, tokens in tokenized(documents, tokenizer, eos, bos, max_docs):
            split = 'val' if in_validation(document.id, job.val_fraction) else 'train'
            record['documents'][split] += 1
            for window in packers[split].add(tokens):
                writers[split].write(window)
                record['windows'][split] += 1
        record['tail_tokens'] = {s: len(packers[s].buffer) for s in SPLITS}
        record['skipped'] = counts.skipped
        for split in SPLITS:
            writers[split].finish()
            with open(os.path.join(folders[split], 'part.json'), 'w') as handle:
                json.dump(record, handle)
    return record


@functools.cache
def worker_tokenizer(file: str):
    """The tokenizer of a worker process, read at its first part and kept for the others (reading a 128k-id
    tokenizer.json takes 0.3 s, as long as tokenizing 150k tokens)."""
    return read_tokenizer(file)


def tokenized(documents, tokenizer, eos: int, bos: int | None, max_docs: int | None):
    """(document, [BOS] + ids + [EOS]) in order; ``tokenize_documents`` encodes a batch at a time, and the tee
    holds only the documents of the batch in flight."""
    ours, texts = itertools.tee(itertools.islice(documents, max_docs))
    return zip(ours, tokenize_documents((document.text for document in texts), tokenizer, eos, bos))


def merge_index(out: str, split: str, parts: int) -> int:
    """``<out>/<split>/index.json`` over parts 0..parts-1 in order (atomically); returns the sample count."""
    shards = []
    for index in range(parts):
        folder = part_folder(out, split, index)
        with open(os.path.join(folder, 'index.json')) as file:
            for shard in json.load(file)['shards']:
                for key in ('raw_data', 'zip_data'):
                    if shard.get(key):
                        shard[key]['basename'] = os.path.join(os.path.basename(folder), shard[key]['basename'])
                shards.append(shard)
    write_atomically(os.path.join(out, split, 'index.json'), json.dumps({'version': 2, 'shards': shards}))
    return sum(shard['samples'] for shard in shards)


CONVERSION = 'conversion.json'  # what the output folder is a conversion of: tokenizer, input files, arguments


def start_output_folder(out: str, tokenizer_sha: str, files: list[str], description: dict) -> None:
    """Record what this conversion is; an output folder started with another tokenizer or other input files
    is refused (mixing them would corrupt the data or misnumber the parts)."""
    path = os.path.join(out, CONVERSION)
    if os.path.isfile(path):
        with open(path) as file:
            previous = json.load(file)
        if previous['tokenizer_sha256'] != tokenizer_sha:
            raise SourceError(f"{out}: was written with another tokenizer (sha256 {previous['tokenizer_sha256'][:12]}, "
                              f"now {tokenizer_sha[:12]}); use a new --out or the same tokenizer")
        if previous['files'] != files:
            raise SourceError(f'{out}: was started on other input files ({len(previous["files"])} then, '
                              f'{len(files)} now); use a new --out or the same input')
    os.makedirs(out, exist_ok=True)
    write_atomically(path, json.dumps({'tokenizer_sha256': tokenizer_sha, 'files': files, **description}))


def convert(job: Job, processes: int, eos_token: str, bos_token: str | None, max_docs: int | None = None,
            description: dict | None = None, progress: bool = True, threads: int | None = None,
            nodes: int = 1, node_rank: int | None = 0) -> dict | None:
    """Convert this node's parts (``node_rank::nodes`` of the sorted input files; none for ``node_rank`` None) not
    yet done; then, if every node's parts exist, merge the indexes and write manifest.json. Returns the manifest, or
    None while other nodes' parts are missing.

    Each worker process tokenizes with ``threads`` threads (default: the cores divided among the processes)."""
    from tqdm import tqdm

    try:
        tokenizer = read_tokenizer(job.tokenizer_file)
    except ValueError as error:
        raise SourceError(f'--tokenizer: {error}') from None
    special_ids(tokenizer, eos_token, bos_token)  # fail before any work
    job.source.check()
    sha = file_sha256(job.tokenizer_file)
    files = job.source.files()
    start_output_folder(job.out, sha, files, description or {})
    mine = [(index, file) for index, file in enumerate(files) if node_rank is not None and index % nodes == node_rank]
    todo = [(index, file) for index, file in mine if not part_done(job.out, index)]
    todo.sort(key=lambda part: -local_size(part[1]))  # largest first, so that no large part finishes last alone
    start, tokens, documents = time.monotonic(), 0, 0
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), unit='part', disable=not (progress and mine))
    threads = threads or max(1, usable_cores() // processes)
    arguments = [(job, index, file, eos_token, bos_token, max_docs) for index, file in todo]
    with worker_pool(processes, threads) as pool:
        futures = [pool.submit(convert_part, *part) for part in arguments]
        try:
            for future in as_completed(futures):
                record = future.result()
                tokens += sum(record['windows'].values()) * job.window
                documents += sum(record['documents'].values())
                seconds = time.monotonic() - start
                bar.set_postfix(docs_per_s=f'{documents / seconds:,.0f}', tokens_per_s=f'{tokens / seconds:,.0f}')
                bar.update()
        except BrokenProcessPool:
            raise SourceError('a converter worker died (killed, or out of memory?); finished parts are kept: '
                              'run the same command again to resume, with fewer --processes if memory ran out')
        finally:
            for future in futures:  # after an error, parts not yet started are not started
                future.cancel()
    bar.close()
    return finalize(job, files, sha, description or {})


def local_size(file: str) -> int:
    """Bytes of a local input file; 0 for one read remotely (a hub part)."""
    return os.path.getsize(file) if os.path.isfile(file) else 0


def missing_parts(out: str) -> list[int]:
    """The parts of the conversion started in ``out`` (its input files, as ``conversion.json`` records them) that no
    node has finished yet."""
    with open(os.path.join(out, CONVERSION)) as file:
        parts = len(json.load(file)['files'])
    return [index for index in range(parts) if not part_done(out, index)]


def finalize(job: Job, files: list[str], sha: str, description: dict) -> dict | None:
    """The indexes and the manifest once every part exists (each file written atomically, the same bytes whichever
    node writes them, so two nodes finishing together are safe); None while a part is missing."""
    return None if missing_parts(job.out) else write_manifest(job, files, sha, description)


def usable_cores() -> int:
    """The cores this process may run on (a Slurm or cgroup CPU set), not all of the host's."""
    return len(os.sched_getaffinity(0))


def worker_pool(processes: int, threads: int) -> ProcessPoolExecutor:
    """Workers forked from a fresh single-threaded server that has imported this module: never forked from
    the caller, whose threads (streaming's, ``datasets``' event loop, tokenizers' pool) may hold locks that a
    forked child would wait on forever (a converter test hung so). They get the caller's environment as it
    is now (credentials set after the server started included)."""
    context = multiprocessing.get_context('forkserver')
    context.set_forkserver_preload([__name__])
    return ProcessPoolExecutor(processes, mp_context=context, initializer=start_worker,
                               initargs=(dict(os.environ), threads))


def start_worker(environment: dict[str, str], threads: int) -> None:
    """The caller's environment, and ``threads`` Rust-side threads for ``tokenizers`` (its pool starts at the
    first batch encode). Parallelism stays on with one thread too: with it off, tokenizers 0.22's
    ``encode_batch_fast`` runs 1.7x slower on one core (483k against 808k tokens/s, same ids; measured for
    scripts/measure_data_prep.py)."""
    os.environ.clear()
    os.environ.update(environment)
    os.environ['RAYON_NUM_THREADS'] = str(threads)
    os.environ['TOKENIZERS_PARALLELISM'] = 'true'


def write_manifest(job: Job, files: list[str], sha: str, description: dict) -> dict:
    records = []
    for index in range(len(files)):
        with open(os.path.join(part_folder(job.out, 'train', index), 'part.json')) as file:
            records.append(json.load(file))
    skipped: dict[str, int] = {}
    for record in records:
        for reason, count in record['skipped'].items():
            skipped[reason] = skipped.get(reason, 0) + count
    manifest = {**description, 'tokenizer': job.tokenizer_file, 'tokenizer_sha256': sha, 'window': job.window,
                'val_fraction': job.val_fraction, 'parts': len(files), 'skipped': skipped}
    for split in SPLITS:
        windows = merge_index(job.out, split, len(files))
        manifest[split] = {'documents': sum(r['documents'][split] for r in records), 'windows': windows,
                           'tokens': windows * job.window,
                           'tail_tokens_dropped': sum(r['tail_tokens'][split] for r in records)}
    for folder in (job.out, *(os.path.join(job.out, split) for split in SPLITS)):  # each split is a stream
        write_atomically(os.path.join(folder, MANIFEST), json.dumps(manifest, indent=2))
    return manifest


def resolve_tokenizer(name_or_path: str, out: str) -> tuple[str, str | None, str | None]:
    """(tokenizer.json path, its EOS, its BOS) for a tokenizer.json, a folder with one, or an HF hub name
    (saved under ``<out>/tokenizer``)."""
    folder = name_or_path if os.path.isdir(name_or_path) else os.path.dirname(name_or_path)
    file = tokenizer_file(name_or_path)
    if not os.path.isfile(file):
        folder = os.path.join(out, 'tokenizer')
        hub_tokenizer(name_or_path).save_pretrained(folder)
        file = os.path.join(folder, 'tokenizer.json')
    special = {}
    config = os.path.join(folder, 'tokenizer_config.json')
    if os.path.isfile(config):
        with open(config) as handle:
            special = json.load(handle)
    token = lambda value: value.get('content') if isinstance(value, dict) else value
    return file, token(special.get('eos_token')), token(special.get('bos_token'))


def hub_tokenizer(name: str):
    """An HF hub tokenizer by name: from the local cache, else from the hub once it answers. Offline, transformers
    retries for about a minute before it gives up; one connection attempt says so in seconds."""
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except OSError:
        pass
    endpoint = os.environ.get('HF_ENDPOINT', 'https://huggingface.co')
    if reason := unreachable(endpoint):
        raise SourceError(f'--tokenizer {name}: neither a tokenizer.json, a folder with one, nor in the HF cache, and '
                          f'{endpoint} is unreachable ({reason}); download it where there is a network '
                          f'(huggingface-cli download {name} --include "tokenizer*") and pass its folder')
    try:
        return AutoTokenizer.from_pretrained(name)
    except OSError as error:
        raise SourceError(f'--tokenizer {name}: neither a tokenizer.json, a folder with one, nor a reachable HF name '
                          f'({str(error).splitlines()[0]})') from None


def unreachable(endpoint: str, timeout_s: float = 5.0) -> str | None:
    """Why a TCP connection to ``endpoint``'s host cannot be made, or None."""
    parsed = urllib.parse.urlparse(endpoint)
    port = parsed.port or (443 if parsed.scheme == 'https' else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__
    return None
