"""The demo's data: a small mixed corpus from text every machine has (the Python standard library), its BPE
tokenizer, and MDS shards per domain with held-out documents.

code: the source files; prose: their docstrings; math: generated arithmetic. Deterministic. Beside them, the demo's
downstream task (``write_demo_task``): a held-out code line's next line among four, as an lm-evaluation-harness task
over local JSON; and the downstream benchmark's task over the learning benchmark's held-out source
(``write_held_out_task``).
"""
import ast
import json
import os
import random
import statistics
import sysconfig
import time
from collections.abc import Iterator

from data_prep.packing import pack, tokenize_documents
from data_prep.train_tokenizer import BOS, EOS, train_bpe
from llmfoundry_ext.data.mds import file_sha256, write_mds

DOMAINS = ('code', 'prose', 'math')
VOCAB_SIZE = 2048
VAL_EVERY = 10  # every 10th document of each domain is held out for the evaluation


def stdlib_files(limit: int) -> list[str]:
    """The first ``limit`` .py files of the standard library, in sorted order (tests and sites skipped)."""
    root = sysconfig.get_paths()['stdlib']
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in ('test', 'tests', 'site-packages', 'idlelib'))
        found.extend(os.path.join(folder, name) for name in sorted(files) if name.endswith('.py'))
    return found[:limit]


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding='utf-8') as file:
            return file.read()
    except (UnicodeDecodeError, OSError):
        return None


def code_documents(files: list[str]) -> Iterator[str]:
    for path in files:
        text = read_text(path)
        if text and text.strip():
            yield text


def prose_documents(files: list[str]) -> Iterator[str]:
    """All docstrings of one module, joined by blank lines, as one document."""
    for path in files:
        text = read_text(path)
        try:
            tree = ast.parse(text or '')
        except SyntaxError:
            continue
        nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        docstrings = [ast.get_docstring(node) for node in nodes]
        joined = '\n\n'.join(d for d in docstrings if d)
        if joined:
            yield joined


def math_documents(count: int, problems_per_document: int = 40, seed: int = 0) -> Iterator[str]:
    """Worked arithmetic: 'a op b = c' lines with + - * over small integers."""
    rng = random.Random(seed)
    for _ in range(count):
        lines = []
        for _ in range(problems_per_document):
            a, b = rng.randint(0, 999), rng.randint(0, 99)
            op = rng.choice('+-*')
            result = a + b if op == '+' else a - b if op == '-' else a * b
            lines.append(f'{a} {op} {b} = {result}')
        yield '\n'.join(lines)


def next_line_questions(documents: list[str], count: int, seed: int = 1, context_lines: int = 3,
                        ending_lines: int = 1) -> list[dict]:
    """``context_lines`` lines of a document, and four candidates for the ``ending_lines`` after them: the real ones
    and as many lines of each of three other documents (a HellaSwag of code; chance 0.25): a model that has learnt
    the code's local structure (indentation, names, brackets) picks the real one more often."""
    rng = random.Random(seed)
    lines = [[line for line in document.splitlines() if line.strip()] for document in documents]
    usable = [document for document in lines if len(document) >= context_lines + ending_lines + 1]
    span = lambda document, at: '\n'.join(document[at:at + ending_lines])
    questions = []
    while len(questions) < count:
        index = rng.randrange(len(usable))
        document = usable[index]
        at = rng.randrange(context_lines, len(document) - ending_lines + 1)
        others = [span(usable[other], rng.randrange(len(usable[other]) - ending_lines + 1))
                  for other in rng.sample(range(len(usable)), 4) if other != index][:3]
        choices = [span(document, at), *others]
        if len(set(choices)) < 4:
            continue
        rng.shuffle(choices)
        questions.append({'context': '\n'.join(document[at - context_lines:at]) + '\n', 'choices': choices,
                          'answer': choices.index(span(document, at))})
    return questions


CHOICE_TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def write_choice_task(folder: str, name: str, questions: list[dict]) -> str:
    """A harness task ``<folder>/<name>.yaml`` over ``<name>.jsonl`` of ``questions`` ({'context', 'choices',
    'answer'}, as ``next_line_questions`` makes them); returns the YAML's path."""
    os.makedirs(folder, exist_ok=True)
    data = os.path.abspath(os.path.join(folder, f'{name}.jsonl'))
    with open(data, 'w') as file:
        file.writelines(json.dumps(question) + '\n' for question in questions)
    path = os.path.join(folder, f'{name}.yaml')
    with open(path, 'w') as file:
        file.write(CHOICE_TASK.format(name=name, data=data))
    return path


def write_tokenizer_config(folder: str) -> None:
    """The ``tokenizer_config.json`` naming BOS and EOS that transformers (and so the harness) reads a tokenizer
    folder by."""
    with open(os.path.join(folder, 'tokenizer_config.json'), 'w') as file:
        json.dump({'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': BOS, 'eos_token': EOS}, file)


def write_held_out_task(work: str, data: dict, roots: list[str], questions: int, name: str,
                        max_chars: int = 400) -> dict:
    """The downstream benchmark's task (``scripts/measure_downstream.py``): next-line questions over the source pieces
    the learning benchmark's corpus (``data``, made of ``roots``) left out, of at most ``max_chars`` (code has lines
    of data thousands long) and whose every choice adds tokens to the context as the harness splits them (its HF
    backend asserts on an empty continuation), as ``<work>/tasks/<name>.yaml``; the tokenizer's
    ``tokenizer_config.json`` beside it. Returns the YAML's path and the questions' lengths in tokens."""
    from llmfoundry_ext.measure.learning import held_out_pieces
    from llmfoundry_ext.downstream import harness_tokenizer

    write_tokenizer_config(data['tokenizer'])
    tokenizer = harness_tokenizer(data['tokenizer'])
    length = lambda text: len(tokenizer.encode(text, add_special_tokens=False))
    candidates = next_line_questions(held_out_pieces(roots, data['documents']), 2 * questions, context_lines=2,
                                     ending_lines=1)
    made = [q for q in candidates if len(q['context']) + max(map(len, q['choices'])) <= max_chars
            and all(length(q['context'] + ' ' + choice) > length(q['context'].rstrip()) for choice in q['choices'])
            ][:questions]
    return {'yaml': write_choice_task(os.path.join(work, 'tasks'), name, made), 'questions': len(made),
            'context_tokens': statistics.fmean(length(q['context']) for q in made),
            'ending_tokens': statistics.fmean(length(choice) for q in made for choice in q['choices']),
            'longest_tokens': max(length(q['context']) + length(choice) for q in made for choice in q['choices'])}


def write_demo_task(root: str, questions: int = 200, files: int = 600) -> None:
    """``<root>/tasks/demo_next_line.yaml`` made from the held-out code documents (the val split's), and the
    tokenizer's ``tokenizer_config.json``."""
    held_out = list(code_documents(stdlib_files(files)))[::VAL_EVERY]
    write_choice_task(os.path.join(root, 'tasks'), 'demo_next_line', next_line_questions(held_out, questions))
    write_tokenizer_config(os.path.join(root, 'tokenizer'))


def demo_corpus(files: int = 600, math_docs: int = 600) -> dict[str, list[str]]:
    """{'code': [...], 'prose': [...], 'math': [...]} documents."""
    paths = stdlib_files(files)
    return {'code': list(code_documents(paths)), 'prose': list(prose_documents(paths)),
            'math': list(math_documents(math_docs))}


def write_demo_data(root: str, window: int) -> None:
    """Tokenizer and, per domain, MDS folders ``<root>/<domain>/train`` and ``/val`` (every VAL_EVERY-th document held
    out); skipped when already there."""
    tokenizer_file = os.path.join(root, 'tokenizer', 'tokenizer.json')
    if os.path.isfile(tokenizer_file) and all(os.path.isdir(os.path.join(root, d, 'val')) for d in DOMAINS):
        print(f'demo data: reusing {root}', flush=True)
        return
    start = time.monotonic()
    corpus = demo_corpus()
    tokenizer = train_bpe((doc for docs in corpus.values() for doc in docs), VOCAB_SIZE)
    os.makedirs(os.path.dirname(tokenizer_file), exist_ok=True)
    tokenizer.save(tokenizer_file)
    eos_id = tokenizer.token_to_id(EOS)
    for domain in DOMAINS:
        documents = corpus[domain]
        splits = {'train': [d for i, d in enumerate(documents) if i % VAL_EVERY], 'val': documents[::VAL_EVERY]}
        counts = []
        for split, split_documents in splits.items():
            windows = pack(tokenize_documents(split_documents, tokenizer, eos_id), window)
            manifest = write_mds(os.path.join(root, domain, split), windows, {
                'source': f'demo:{domain}', 'split': split, 'documents': len(split_documents), 'window': window,
                'tokenizer': tokenizer_file, 'tokenizer_sha256': file_sha256(tokenizer_file)})
            counts.append(f"{split} {manifest['documents']} documents -> {manifest['windows']} windows")
        print(f"demo data: {domain}: {', '.join(counts)} of {window} tokens", flush=True)
    print(f'demo data: ready in {time.monotonic() - start:.0f} s under {root}', flush=True)
