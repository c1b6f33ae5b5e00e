"""Source readers on small local fixtures with each dataset's real layout and schema; Stack-v2 over real S3 calls
to a moto server on 127.0.0.1 (the s3_endpoint fixture)."""
import gzip
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.sources import (BlobStore, Counts, Document, SourceError, finemath_files, jsonl_source, parquet_source,
                               stack_v2_source, zyda2_files)


def write_parquet(path, columns: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table(columns), path)


@pytest.fixture
def zyda2_folder(tmp_path) -> str:
    """data/<component>/... as the hub download leaves it; zyda's folder name ends in a space."""
    write_parquet(tmp_path / 'data' / 'zyda_crossdeduped-filtered ' / 'zyda_refinedweb' / 'train-0.parquet',
                  {'nemo_id': ['z-1', 'z-2'], 'text': ['first zyda', 'second zyda'],
                   'filtering_features': ['{}', '{}']})
    write_parquet(tmp_path / 'data' / 'dclm_crossdeduped' / 'global-shard_01' / 'train-0.parquet',
                  {'nemo_id': ['d-1', 'd-2', 'd-3'], 'text': ['dclm one', '', 'dclm three'],
                   'dclm_fasttext_score': [0.9, 0.1, 0.5], 'language_id_whole_page_fasttext': [{'en': 0.9}] * 3})
    return str(tmp_path)


def read(source) -> list[tuple[str, str]]:
    return [(document.id, document.text) for document in source]


def test_zyda2_component_in_a_folder_ending_in_a_space(zyda2_folder):
    counts = Counts()
    files = zyda2_files(zyda2_folder, 'zyda_crossdeduped-filtered')
    assert read(parquet_source(files, 'text', 'nemo_id', counts)) == [('z-1', 'first zyda'), ('z-2', 'second zyda')]
    assert counts.skipped == {}


def test_zyda2_component_with_extra_columns_and_an_empty_row(zyda2_folder):
    counts = Counts()
    files = zyda2_files(zyda2_folder, 'dclm_crossdeduped')
    assert read(parquet_source(files, 'text', 'nemo_id', counts)) == [('d-1', 'dclm one'), ('d-3', 'dclm three')]
    assert counts.skipped == {'empty or missing text': 1}


def test_zyda2_unknown_component_and_missing_column(zyda2_folder):
    with pytest.raises(SourceError, match="zyda2: unknown component 'fineweb'; one of dclm_crossdeduped, fwe3, "):
        zyda2_files(zyda2_folder, 'fineweb')
    files = zyda2_files(zyda2_folder, 'dclm_crossdeduped')
    with pytest.raises(SourceError, match=r"train-0.parquet: no column 'content' \(it has nemo_id, text, "):
        list(parquet_source(files, 'content', 'nemo_id', Counts()))


def test_finemath_config(tmp_path):
    write_parquet(tmp_path / 'finemath-3plus' / 'train-00000-of-00002.parquet',
                  {'url': ['https://a', 'https://b'], 'text': ['1 + 1 = 2', 'x^2'], 'score': [3.1, 4.2],
                   'int_score': [3, 4], 'token_count': [7, 3]})
    files = finemath_files(str(tmp_path), 'finemath-3plus')
    assert read(parquet_source(files, 'text', 'url', Counts())) == [('https://a', '1 + 1 = 2'), ('https://b', 'x^2')]


def test_jsonl_counts_non_utf8_and_empty_rows(tmp_path):
    path = tmp_path / 'docs.jsonl'
    path.write_bytes(b'{"text": "good one"}\n{"text": "caf\xe9"}\n{"text": ""}\n{"text": "good two", "id": "x"}\n')
    counts = Counts()
    assert read(jsonl_source([str(path)], 'text', 'id', counts)) == [('docs.jsonl:0', 'good one'), ('x', 'good two')]
    assert counts.skipped == {'not UTF-8 JSON': 1, 'empty or missing text': 1}


def test_stack_v2_repositories_from_s3(s3_endpoint, tmp_path, monkeypatch):
    for name, value in {'AWS_ACCESS_KEY_ID': 'test', 'AWS_SECRET_ACCESS_KEY': 'test',
                        'AWS_DEFAULT_REGION': 'us-east-1'}.items():
        monkeypatch.setenv(name, value)
    store = BlobStore(endpoint_url=s3_endpoint)
    store.client.create_bucket(Bucket='softwareheritage')
    blobs = {'b1': 'def f():\n    return 1\n'.encode('utf-8'), 'b2': 'print("é")\n'.encode('latin-1'),
             'b3': '# only file\n'.encode('utf-8')}
    for blob_id, data in blobs.items():
        store.client.put_object(Bucket='softwareheritage', Key=f'content/{blob_id}', Body=gzip.compress(data))
    file = lambda blob_id, encoding='UTF-8': {'blob_id': blob_id, 'path': f'{blob_id}.py', 'language': 'Python',
                                              'src_encoding': encoding, 'length_bytes': 10, 'is_vendor': False,
                                              'is_generated': False, 'detected_licenses': ['mit'],
                                              'license_type': 'permissive'}
    write_parquet(tmp_path / 'data' / 'train-00000.parquet', {
        'repo_name': ['a/one', 'b/two', 'c/three'],
        'files': [[file('b1'), file('missing'), file('b2', 'ISO-8859-1')], [file('gone')], [file('b3')]],
        'star_events_count': [5, 1, 0]})
    counts = Counts()
    documents = list(stack_v2_source([str(tmp_path / 'data' / 'train-00000.parquet')], store, counts))
    assert documents == [Document('a/one', 'def f():\n    return 1\n\n\nprint("é")\n'),
                         Document('c/three', '# only file\n')]
    assert counts.skipped == {'missing blob': 2, 'repository with no readable file': 1}


def test_without_a_local_copy_zyda2_and_finemath_stream_from_the_hub():
    from data_prep.sources import HubSource, parse_source
    assert parse_source('zyda2:fwe3') == HubSource('Zyphra/Zyda-2', 'fwe3', None, 'text', 'nemo_id')
    assert parse_source('finemath:finemath-4plus') == HubSource('HuggingFaceTB/finemath', 'finemath-4plus', None,
                                                                'text', 'url')
    with pytest.raises(SourceError, match='stack-v2: give --input, the folder of the gated smol-ids parquet files'):
        parse_source('stack-v2')
