"""Readers of raw text, one per source: each yields ``Document(id, text)`` in a fixed order.

Sources read local folders as ``huggingface-cli download`` leaves them (or plain files); Stack-v2 rows list a
repository's files, whose contents are gzip blobs in the Software Heritage S3 bucket, fetched with boto3.
"""
import glob
import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow
import pyarrow.parquet as pq


class SourceError(ValueError):
    """A source that cannot be read as asked: one line naming it and the fix."""


@dataclass(frozen=True)
class Document:
    id: str
    text: str


@dataclass
class Counts:
    """What a source skipped, and why (reported in the manifest)."""
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


ZYDA2_COMPONENTS = {  # config -> folder under data/ (the last one really ends in a space)
    'dclm_crossdeduped': 'dclm_crossdeduped',
    'fwe3': 'fwe3',
    'dolma-cc_crossdeduped-filtered': 'dolma-cc_crossdeduped-filtered',
    'zyda_crossdeduped-filtered': 'zyda_crossdeduped-filtered ',
}
FINEMATH_CONFIGS = ('finemath-3plus', 'finemath-4plus', 'infiwebmath-3plus', 'infiwebmath-4plus')


def files_under(root: str, pattern: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(glob.escape(root), pattern), recursive=True))
    if not files:
        raise SourceError(f'{root}: no files match {pattern}')
    return files


def check_columns(path: str, columns: list[str]) -> pq.ParquetFile:
    """The file, if it has ``columns``; else one line naming the first missing one and those it has."""
    try:
        table = pq.ParquetFile(path)
    except (pyarrow.ArrowInvalid, OSError) as error:
        raise SourceError(f'{path}: not a parquet file ({str(error).splitlines()[0]}); give parquet files, or '
                          f'jsonl:<glob> for JSON lines') from None
    missing = [c for c in columns if c not in table.schema_arrow.names]
    if missing:
        raise SourceError(f'{path}: no column {missing[0]!r} (it has {", ".join(table.schema_arrow.names)})')
    return table


def parquet_rows(path: str, columns: list[str]) -> Iterator[dict]:
    """Rows of ``columns`` only (Zyda-2 components differ in their other columns), batch by batch."""
    for batch in check_columns(path, columns).iter_batches(columns=columns, batch_size=1024):
        yield from batch.to_pylist()


def text_documents(rows: Iterator[dict], text_column: str, id_of, counts: Counts) -> Iterator[Document]:
    """Rows -> documents; rows with no text or empty text are counted and skipped."""
    for row in rows:
        text = row.get(text_column)
        if not isinstance(text, str) or not text.strip():
            counts.skip('empty or missing text')
            continue
        yield Document(str(id_of(row)), text)


def parquet_source(files: list[str], text_column: str, id_column: str | None, counts: Counts) -> Iterator[Document]:
    for path in files:
        columns = [text_column] + ([id_column] if id_column else [])
        rows = parquet_rows(path, columns)
        numbered = ({**row, '_row': f'{os.path.basename(path)}:{i}'} for i, row in enumerate(rows))
        yield from text_documents(numbered, text_column, lambda r: r[id_column] if id_column else r['_row'], counts)


GZIP_MAGIC = b'\x1f\x8b'


def open_lines(path: str):
    """A JSON-lines file for reading bytes, gzip-compressed (as Dolma ships its .json.gz) or not, by its first bytes."""
    with open(path, 'rb') as file:
        compressed = file.read(2) == GZIP_MAGIC
    return gzip.open(path, 'rb') if compressed else open(path, 'rb')


def check_first_line(path: str) -> None:
    with open_lines(path) as file:
        first = file.readline()
    try:
        if first:
            json.loads(first.decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SourceError(f'{path}: its first line is not UTF-8 JSON (compressed other than by gzip?); give JSON '
                          f'lines, plain or gzip-compressed') from None


def jsonl_source(files: list[str], text_column: str, id_column: str | None, counts: Counts) -> Iterator[Document]:
    for path in files:
        with open_lines(path) as file:
            for number, raw in enumerate(file):
                try:
                    row = json.loads(raw.decode('utf-8'))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    counts.skip('not UTF-8 JSON')
                    continue
                if text_column not in row:
                    raise SourceError(f'{path}:{number + 1}: no field {text_column!r}; set --text-column')
                row.setdefault('_row', f'{os.path.basename(path)}:{number}')
                yield from text_documents(iter([row]), text_column, lambda r: r.get(id_column) or r['_row'], counts)


def check_config(kind: str, config: str) -> None:
    valid = ZYDA2_COMPONENTS if kind == 'zyda2' else FINEMATH_CONFIGS
    if config not in valid:
        noun = 'component' if kind == 'zyda2' else 'config'
        raise SourceError(f"{kind}: unknown {noun} {config!r}; one of {', '.join(valid)}")


def zyda2_files(root: str, component: str) -> list[str]:
    check_config('zyda2', component)
    return files_under(os.path.join(root, 'data', ZYDA2_COMPONENTS[component]), '**/*.parquet')


def finemath_files(root: str, config: str) -> list[str]:
    check_config('finemath', config)
    return files_under(os.path.join(root, config), '**/*.parquet')


class BlobStore:
    """Software Heritage contents on S3 (or any S3-compatible endpoint): gzip blobs by id."""

    def __init__(self, bucket: str = 'softwareheritage', prefix: str = 'content/', endpoint_url: str | None = None):
        import boto3
        self.client = boto3.client('s3', endpoint_url=endpoint_url)
        self.bucket, self.prefix = bucket, prefix

    def check(self) -> None:
        """Fail before any work if the endpoint cannot be reached or no credentials are set (a missing bucket
        or a refused listing still reaches it)."""
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            return
        except BotoCoreError as error:
            raise SourceError(f's3://{self.bucket} at {self.client.meta.endpoint_url}: {error}; check --s3-endpoint, '
                              f'the network and the AWS credentials in the environment') from None

    def text(self, blob_id: str, encoding: str) -> str | None:
        """The decoded file, or None when the blob does not exist."""
        from botocore.exceptions import ClientError
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + blob_id)['Body'].read()
        except ClientError as error:
            if error.response.get('Error', {}).get('Code') in ('NoSuchKey', '404'):
                return None
            raise
        return gzip.decompress(body).decode(encoding or 'utf-8', errors='replace')


def stack_v2_source(files: list[str], store: BlobStore, counts: Counts) -> Iterator[Document]:
    """One document per repository: its files' contents, in listed order, joined by a blank line."""
    for path in files:
        for row in parquet_rows(path, ['repo_name', 'files']):
            contents = []
            for entry in row['files']:
                text = store.text(entry['blob_id'], entry.get('src_encoding'))
                if text is None:
                    counts.skip('missing blob')
                    continue
                contents.append(text)
            if not contents:
                counts.skip('repository with no readable file')
                continue
            yield Document(row['repo_name'], '\n\n'.join(contents))


@dataclass(frozen=True)
class TableSource:
    """Parquet or jsonl files with a text column (and an id column, else file:row)."""
    paths: tuple[str, ...]
    text_column: str = 'text'
    id_column: str | None = None
    kind: str = 'parquet'

    def files(self) -> list[str]:
        return list(self.paths)

    def check(self) -> None:
        """Fail before any work if a parquet file lacks the columns, or the JSON-lines files are all empty or one
        does not start with a line of UTF-8 JSON."""
        if self.kind == 'parquet':
            for path in self.paths:
                check_columns(path, [self.text_column] + ([self.id_column] if self.id_column else []))
            return
        if not any(os.path.getsize(path) for path in self.paths):
            raise SourceError(f"jsonl: {', '.join(self.paths[:3])}{' ...' if len(self.paths) > 3 else ''}: "
                              f"{'every file is' if len(self.paths) > 1 else 'the file is'} empty; give files with "
                              f"documents")
        for path in self.paths:
            check_first_line(path)

    def documents(self, file: str, counts: Counts) -> Iterator[Document]:
        read = parquet_source if self.kind == 'parquet' else jsonl_source
        return read([file], self.text_column, self.id_column, counts)


@dataclass(frozen=True)
class StackV2Source:
    """smol-ids parquet rows; file contents from S3 (``endpoint_url`` for an S3-compatible server)."""
    paths: tuple[str, ...]
    endpoint_url: str | None = None
    bucket: str = 'softwareheritage'

    def files(self) -> list[str]:
        return list(self.paths)

    def check(self) -> None:
        for path in self.paths:
            check_columns(path, ['repo_name', 'files'])
        BlobStore(self.bucket, endpoint_url=self.endpoint_url).check()

    def documents(self, file: str, counts: Counts) -> Iterator[Document]:
        return stack_v2_source([file], BlobStore(self.bucket, endpoint_url=self.endpoint_url), counts)


@dataclass(frozen=True)
class HubSource:
    """A dataset read with ``datasets`` streaming (from the hub, or a builder such as 'parquet' over
    ``data_files``); its file shards are the parts."""
    path: str
    name: str | None = None
    data_files: str | None = None
    text_column: str = 'text'
    id_column: str | None = None

    def stream(self):
        from datasets import load_dataset
        return load_dataset(self.path, name=self.name, data_files=self.data_files, split='train', streaming=True)

    def files(self) -> list[str]:
        return [f'{self.path}/{self.name or ""}#shard-{i}' for i in range(self.stream().num_shards)]

    def check(self) -> None:
        columns = self.stream().column_names
        for column in [self.text_column] + ([self.id_column] if self.id_column else []):
            if columns is not None and column not in columns:
                raise SourceError(f'{self.path} {self.name or ""}: no column {column!r} (it has {", ".join(columns)})')

    def documents(self, part: str, counts: Counts) -> Iterator[Document]:
        stream = self.stream()
        index = int(part.rsplit('#shard-', 1)[1])
        rows = stream.shard(num_shards=stream.num_shards, index=index).select_columns(
            [self.text_column] + ([self.id_column] if self.id_column else []))
        numbered = ({**row, '_row': f'{part}:{i}'} for i, row in enumerate(rows))
        return text_documents(numbered, self.text_column, lambda r: r[self.id_column] if self.id_column else r['_row'],
                              counts)


SOURCE_FORMS = 'zyda2:<component>, finemath:<config>, stack-v2, parquet:<glob>, jsonl:<glob>'


def parse_source(spec: str, input_folder: str | None = None, text_column: str = 'text', id_column: str | None = None,
                 s3_endpoint: str | None = None):
    """``--source`` -> a source object with ``files()`` and ``documents(file, counts)``."""
    kind, _, argument = spec.partition(':')
    if kind in ('zyda2', 'finemath') and not input_folder:  # no local copy: stream from the hub
        check_config(kind, argument)
        return HubSource(HUB_NAMES[kind], argument, None, 'text', 'nemo_id' if kind == 'zyda2' else 'url')
    if kind == 'stack-v2' and not input_folder:
        raise SourceError(f'{spec}: give --input, the folder of the gated smol-ids parquet files (huggingface-cli '
                          f'download {HUB_NAMES[kind]} --repo-type dataset --local-dir <folder>)')
    if kind == 'zyda2':
        return TableSource(tuple(zyda2_files(input_folder, argument)), 'text', 'nemo_id')
    if kind == 'finemath':
        return TableSource(tuple(finemath_files(input_folder, argument)), 'text', 'url')
    if kind == 'stack-v2':
        return StackV2Source(tuple(files_under(input_folder, '**/*.parquet')), s3_endpoint)
    if kind in ('parquet', 'jsonl') and argument:
        paths = sorted(glob.glob(argument, recursive=True))
        if not paths:
            raise SourceError(f'{spec}: no files match {argument}')
        return TableSource(tuple(paths), text_column, id_column, kind)
    raise SourceError(f"unknown source {spec!r}; use one of {SOURCE_FORMS}")


HUB_NAMES = {'zyda2': 'Zyphra/Zyda-2', 'finemath': 'HuggingFaceTB/finemath',
             'stack-v2': 'bigcode/the-stack-v2-train-smol-ids'}
