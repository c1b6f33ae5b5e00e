"""Downstream evaluation: our model under lm-evaluation-harness scores the harness's tasks as the harness's own HF
backend scores the same weights (a tiny model trained a few steps and exported with to-hf; CPU, fp32); during
training the metrics it logs are the ones scripts/evaluate.py gives the checkpoint of the same batch, training is
untouched by it (the same losses and samples, bit for bit), two processes under FSDP2 give the metrics of one, and
a kill -9 inside an evaluation loses no checkpoint: the resumed run evaluates as the uninterrupted one."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager
from transformers import AutoTokenizer

import llmfoundry_ext.downstream
from data_prep.train_tokenizer import BOS, EOS, train_bpe
from llmfoundry_ext.callbacks.sample_ledger import read_ledger
from llmfoundry_ext.checkpoint import export_to_hf
from llmfoundry_ext.data.mds import write_mds
from llmfoundry_ext.downstream import (Generation, HarnessModel, harness_tokenizer, model_input, shared_contexts,
                                      token_batches)
from llmfoundry_ext.errors import ConfigError
from llmfoundry_ext.launch import LAUNCHER
from llmfoundry_ext.model.llama import Transformer
from llmfoundry_ext.preflight import prepare
from llmfoundry_ext.train import main as train_main, train
from llmfoundry_ext.weights import load_weights_folder, load_into
from scripts.evaluate import main as evaluate_main
from tests.conftest import FORKED, REPO, change, changes, config_error, write_yaml
from tests.model.test_llama import TINY

CHOICE_TASK = """task: arithmetic_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: what is {{{{a}}}} plus {{{{b}}}}?\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""
LAST_WORD_TASK = """task: last_word
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text.split(' ')[:-1] | join(' ')}}}}"
doc_to_target: "{{{{' ' + text.split(' ')[-1]}}}}"
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
NEXT_WORDS_TASK = """task: next_words
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{text.split(' ')[:-1] | join(' ')}}}}"
doc_to_target: "{{{{text.split(' ')[-1]}}}}"
generation_kwargs:
  until: [" red", "\\n\\n"]
  max_gen_toks: 5
  do_sample: false
filter_list:
  - name: first_word
    filter:
      - function: regex
        regex_pattern: "([a-z]+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""
TASKS = ['arithmetic_choice', 'last_word', 'next_words']
WORDS = 'the cat dog sat ran on under mat hill and then a big small red green house tree'.split()


def arithmetic_questions(count: int) -> list[dict]:
    """Sums with four choices of different lengths (the sum, +7, the product, +100), the answer's place varying."""
    generator = random.Random(0)
    questions = []
    for _ in range(count):
        a, b = generator.randint(1, 60), generator.randint(1, 60)
        choices = [f' {value}' for value in (a + b, a + b + 7, a * b, a + b + 100)]
        generator.shuffle(choices)
        questions.append({'a': a, 'b': b, 'choices': choices, 'answer': choices.index(f' {a + b}')})
    return questions


def sentences(count: int, seed: int = 1) -> list[dict]:
    generator = random.Random(seed)
    return [{'text': ' '.join(generator.choice(WORDS) for _ in range(generator.randint(4, 12)))}
            for _ in range(count)]


def write_jsonl(path, rows: list[dict]) -> str:
    path.write_text(''.join(json.dumps(row) + '\n' for row in rows))
    return str(path)


@pytest.fixture(scope='module')
def tasks_folder(tmp_path_factory) -> str:
    """A 240-question multiple-choice task, a 120-text last-word task and a 60-text task generating the last word
    (greedy, up to 5 tokens or " red"), as harness task YAMLs over local JSON."""
    folder = tmp_path_factory.mktemp('tasks')
    (folder / 'arithmetic_choice.yaml').write_text(CHOICE_TASK.format(
        data=write_jsonl(folder / 'arithmetic.jsonl', arithmetic_questions(240))))
    (folder / 'last_word.yaml').write_text(LAST_WORD_TASK.format(
        data=write_jsonl(folder / 'last_word.jsonl', sentences(120))))
    (folder / 'next_words.yaml').write_text(NEXT_WORDS_TASK.format(
        data=write_jsonl(folder / 'next_words.jsonl', sentences(60, seed=7))))
    return str(folder)


def training_texts() -> list[str]:
    """Text like the tasks' (other sums and sentences), so the tiny model scores them better than chance."""
    sums = [f'Question: what is {q["a"]} plus {q["b"]}?\nAnswer: {q["a"] + q["b"]}' for q in arithmetic_questions(600)]
    return sums[240:] + [row['text'] for row in sentences(600)[120:]]


@pytest.fixture(scope='module')
def tokenizer_folder(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp('tokenizer')
    train_bpe(training_texts(), vocab_size=300).save(str(folder / 'tokenizer.json'))
    (folder / 'tokenizer_config.json').write_text(json.dumps(
        {'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': BOS, 'eos_token': EOS}))
    return str(folder)


@pytest.fixture
def texts_config(tiny_config, tmp_path, tokenizer_folder) -> dict:
    """The tiny run on the training texts (32-token windows of their ids), 200 batches at lr 3e-3, fp32, one
    process without FSDP."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    ids = np.array([token for text in training_texts() for token in tokenizer.encode(text + EOS)], dtype=np.uint32)
    windows = ids[:len(ids) // 32 * 32].reshape(-1, 32)
    write_mds(str(tmp_path / 'texts'), windows, {'source': 'texts', 'window': 32})
    tiny_config.update(max_duration='200ba', parallelism={'fsdp': None},
                       optimizer={'name': 'decoupled_adamw', 'lr': 3e-3})
    tiny_config['data'] = {'tokenizer': tokenizer_folder, 'train': {'streams': {'texts': {'local': str(
        tmp_path / 'texts')}}, 'shuffle_seed': 3}}
    return tiny_config


@pytest.fixture
def trained(texts_config, tmp_path) -> str:
    """The run folder of the tiny model trained on the texts."""
    train(prepare(write_yaml(texts_config, tmp_path / 'run.yaml'))).close()
    return str(tmp_path / 'checkpoints' / 'tiny')


def harness_model(folder: str, batch_tokens: int) -> HarnessModel:
    config, tensors = load_weights_folder(folder)
    transformer = Transformer(config).eval()
    load_into(transformer, tensors)
    return HarnessModel(transformer, AutoTokenizer.from_pretrained(folder), config.max_seq_len, batch_tokens)


def evaluate(tasks_folder: str, model, model_args: dict | None = None, tasks: list[str] = TASKS[:2],
             num_fewshot: int = 0) -> dict:
    """The harness's own ``simple_evaluate`` on the local tasks (the harness's ~14,000 task YAMLs left unindexed: ~5 s
    a call that no task here needs; no process pool forked from this worker)."""
    return simple_evaluate(model=model, model_args=model_args, tasks=tasks, num_fewshot=num_fewshot, device='cpu',
                           batch_size=16, task_manager=TaskManager(include_path=tasks_folder, include_defaults=False),
                           log_samples=True, bootstrap_iters=0)


def per_sample(results: dict, task: str) -> list[tuple[int, list]]:
    return sorted((sample['doc_id'], [response[0] for response in sample['resps']])
                  for sample in results['samples'][task])


def assert_same_scores(ours: dict, theirs: dict) -> None:
    """The same tasks; equal metrics (to float rounding) and, sample by sample, the same prompts, log-likelihoods
    within 1e-4 and the same greedy flags, or the same generated text."""
    assert sorted(ours['results']) == sorted(theirs['results'])
    for task, metrics in theirs['results'].items():
        scored = {name: value for name, value in metrics.items() if ',' in name and 'stderr' not in name}
        print(task, {name: (ours['results'][task][name], value) for name, value in scored.items()})
        assert {name: ours['results'][task][name] for name in scored} == pytest.approx(scored, rel=1e-5, abs=0)
        assert prompts(ours, task) == prompts(theirs, task)
        ours_samples, their_samples = per_sample(ours, task), per_sample(theirs, task)
        for (_, our_responses), (_, their_responses) in zip(ours_samples, their_samples, strict=True):
            if isinstance(their_responses[0], str):  # generated
                assert our_responses == their_responses
                continue
            assert [greedy for _, greedy in our_responses] == [greedy for _, greedy in their_responses]
            assert [ll for ll, _ in our_responses] == pytest.approx([ll for ll, _ in their_responses], abs=1e-4)


def prompts(results: dict, task: str) -> list[tuple[int, str]]:
    """Each document's prompt (its first request's context: the few-shot examples drawn, then the question)."""
    return sorted((sample['doc_id'], sample['arguments'][0][0]) for sample in results['samples'][task])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_harness_metrics_and_log_likelihoods_equal_its_hf_backend_on_the_export(trained, tasks_folder, tmp_path):
    """Ours on the to-hf export (zero-shot, and 2-shot with the generation task), and scripts/evaluate.py on the
    run's checkpoint in one process and two (2-shot: its ranks forked from the suite's import, in the environment
    Composer's launcher gives them), beside the harness's HF backend."""
    export_to_hf(trained, str(tmp_path / 'hf'), torch.float32)
    hf = {'pretrained': str(tmp_path / 'hf'), 'dtype': 'float32'}
    for shots, tasks in ((0, TASKS[:2]), (2, TASKS)):
        ours = evaluate(tasks_folder, harness_model(str(tmp_path / 'hf'), batch_tokens=200), tasks=tasks,
                        num_fewshot=shots)
        theirs = evaluate(tasks_folder, 'hf', hf, tasks, num_fewshot=shots)
        assert_same_scores(ours, theirs)
    choice, last_word = ours['results']['arithmetic_choice'], ours['results']['last_word']
    assert choice['acc,none'] != choice['acc_norm,none']  # the choices' lengths differ, so the norm matters
    assert choice['acc,none'] > 0.3 and last_word['acc,none'] > 0  # trained: better than chance (0.25, 1/18)
    arguments = [trained, '--tasks', *TASKS, '--include', tasks_folder, '--batch-tokens', '300', '--num-fewshot', '2']
    assert evaluate_main([*arguments, '--json', str(tmp_path / 'evaluate.json')]) == 0
    assert_same_scores(json.loads((tmp_path / 'evaluate.json').read_text()), theirs)
    two_processes = subprocess.run(  # ranks forked as Composer's launcher starts them (FORKED: not the subject)
        [*FORKED, '-n', '2', os.path.join(REPO, 'scripts', 'evaluate.py'), *arguments, '--json',
         str(tmp_path / 'evaluate2.json')], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert two_processes.returncode == 0, two_processes.stderr[-2000:]
    assert 'scored by 2 processes, each its share of the requests built as one process builds them' in (
        two_processes.stdout)
    assert_same_scores(json.loads((tmp_path / 'evaluate2.json').read_text()), theirs)
    assert_generation_is_exercised(theirs, AutoTokenizer.from_pretrained(str(tmp_path / 'hf')))


def assert_generation_is_exercised(results: dict, tokenizer) -> None:
    """All 60 of next_words' texts generated, some to max_gen_toks (5 tokens). Those cut before it (at " red" or the
    EOS: some under torch 2.11; none under 2.15, whose tiny model answers ' a a ' to every context) are the HF
    backend's too; stopping at a stop string is checked token by token in the greedy generation test."""
    texts = [response for _, (response,) in per_sample(results, 'next_words')]
    lengths = [len(tokenizer.encode(text, add_special_tokens=False)) for text in texts]
    print('next_words', texts[:8], lengths.count(5))
    assert len(texts) == 60 and lengths.count(5) > 0


def test_batches_hold_at_most_the_token_budget_longest_first():
    lengths = [5, 30, 12, 12, 40, 3]
    assert token_batches(lengths, 40) == [[4], [1], [2, 3, 0], [5]]
    assert token_batches(lengths, 1000) == [[4, 1, 2, 3, 0, 5]]
    assert token_batches([], 40) == []


def test_model_input_drops_the_last_token_and_cuts_from_the_left():
    assert model_input([1, 2, 3], [4, 5], max_length=10) == ([1, 2, 3, 4], [4, 5])
    assert model_input([1, 2, 3], [4, 5], max_length=3) == ([2, 3, 4], [4, 5])
    assert model_input([1, 2], [3, 4, 5, 6, 7], max_length=3) == ([4, 5, 6], [5, 6, 7])  # the window predicts 5-7


def test_choices_sharing_a_context_score_as_one_forward_each():
    """One row per context (its branches masked apart) gives each request's log-likelihood and greedy flag as a
    forward of that request alone, in one batch or several, with unshared requests and an empty continuation
    beside them."""
    torch.manual_seed(0)
    model = Transformer(replace(TINY, vocab_size=50)).eval()
    model.init_weights()
    tokenizer = type('Tokenizer', (), {'eos_token_id': 0, 'bos_token_id': None})()
    question, other = [3, 8, 13, 21, 4], [5, 6]
    requests = [(None, question, [7]), (None, question, [9, 11, 2]), (None, other, [30, 31]),
                (None, question, [1, 2, 3, 4, 5]), (None, [40, 41, 42], [43]), (None, other, [32]), (None, other, [])]
    expected = []
    for _, context, continuation in requests:
        tokens = (context + continuation)[:-1]
        with torch.no_grad():
            logprobs = model(torch.tensor([tokens]))[0].log_softmax(-1)[len(context) - 1:]
        picked = logprobs.gather(-1, torch.tensor(continuation, dtype=torch.long)[:, None])
        expected.append((float(picked.sum()), bool((logprobs.argmax(-1) == torch.tensor(continuation)).all())))
    for batch_tokens in (1000, 12):
        ours = HarnessModel(model, tokenizer, max_length=64, batch_tokens=batch_tokens)._loglikelihood_tokens(requests)
        assert [greedy for _, greedy in ours] == [greedy for _, greedy in expected]
        assert ours[-1] == (0.0, True)
        for (score, _), (reference, _) in zip(ours, expected):
            assert score == pytest.approx(reference, abs=1e-5)
    assert [len(row.branches) for row in shared_contexts([model_input(c, x, 64) for _, c, x in requests])] == [
        3, 2, 1]


def test_greedy_generation_in_a_batch_is_each_contexts_own():
    """Contexts of different lengths decoded together (left-padded, with the KV cache; read in one forward or in
    parts) give the tokens of decoding each alone by whole forwards; each stops at its own limit, the EOS, or a stop
    string in its last tokens."""
    torch.manual_seed(0)
    model = Transformer(replace(TINY, vocab_size=50)).eval()
    model.init_weights()
    contexts = [[3, 8, 13, 21, 4, 9, 9], [5, 6], [40, 41, 42, 43], [44, 45, 46, 47, 48, 49]]

    def alone(context: list[int], limit: int) -> list[int]:
        tokens = list(context)
        with torch.no_grad():
            for _ in range(limit):
                tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
        return tokens[len(context):]

    expected = [alone(context, 9) for context in contexts]
    eos = next(token for token in expected[1][1:]  # a token of row 1's, and not of the others' (before their ends)
               if token not in expected[0][:4] + expected[2][:2] + expected[3])
    stop = str(expected[2][1])  # row 2's second token, as a stop string
    tokenizer = type('Tokenizer', (), {'eos_token_id': eos, 'bos_token_id': None,
                                       'decode': lambda self, tokens: ' '.join(map(str, tokens))})()
    rows = [Generation(contexts[0], 4, ()), Generation(contexts[1], 9, ()), Generation(contexts[2], 9, ((stop, 1),)),
            Generation(contexts[3], 9, ())]

    def cut(tokens: list[int], row: Generation) -> list[int]:
        """``tokens`` up to the row's limit, the EOS, or a token whose text holds its stop string."""
        end = next((place for place, token in enumerate(tokens[:row.max_new])
                    if token == eos or any(text in str(token) for text, _ in row.stops)), row.max_new - 1)
        return tokens[:end + 1]

    ends = [cut(tokens, row) for tokens, row in zip(expected, rows)]
    assert len(ends[0]) == 4 and ends[1][-1] == eos and stop in str(ends[2][-1]) and len(ends[3]) == 9  # all ways
    for batch_tokens in (8192, 14):  # the contexts read in one forward, or in parts of 2 rows
        assert HarnessModel(model, tokenizer, 64, batch_tokens).decode_greedily(rows, steps=9) == ends


def test_text_is_encoded_as_the_hf_backend_encodes_it(tokenizer_folder, tmp_path):
    """The tokenizer's own special tokens unless told (a BOS, for a tokenizer that adds one), none where the text
    starts with the BOS; and a generation task asking for as many tokens as the context is refused."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast
    plain = AutoTokenizer.from_pretrained(tokenizer_folder)
    bos_id = plain.convert_tokens_to_ids(BOS)
    adding = PreTrainedTokenizerFast(tokenizer_object=plain.backend_tokenizer, bos_token=BOS, eos_token=EOS)
    adding.backend_tokenizer.post_processor = TemplateProcessing(single=f'{BOS} $A', special_tokens=[(BOS, bos_id)])
    model = Transformer(replace(TINY, vocab_size=300))
    words = plain.encode('the cat sat', add_special_tokens=False)
    for tokenizer, expected in ((plain, words), (adding, [bos_id, *words])):
        harness = HarnessModel(model, tokenizer, max_length=64)
        assert harness.tok_encode('the cat sat') == expected
        assert harness.tok_encode(f'{BOS}the cat sat') == [bos_id, *words]
        assert harness.tok_encode('the cat sat', add_special_tokens=False) == words
    with pytest.raises(ConfigError, match="^a generation task asks for 64 tokens \\(max_gen_toks\\), not fewer than "
                                          "the model's context of 64; lower max_gen_toks in its generation_kwargs$"):
        Generation.of(harness, 'the cat', {'until': ['\n'], 'max_gen_toks': 64}, EOS)


BUSY_GLOO_AT_EXIT = """
import atexit, socket
import torch
import torch.distributed as dist
from llmfoundry_ext.downstream import exit_process
with socket.socket() as free:
    free.bind(('127.0.0.1', 0))
    port = free.getsockname()[1]
dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=0, world_size=1)
atexit.register(print, 'the interpreter tore itself down')
print('results written', end='')  # left in the buffer for exit_process to flush
for _ in range(16):  # left to gloo's worker threads; Python lets go of the tensors at once
    dist.all_reduce(torch.ones(10_000_000), async_op=True)
exit_process(0)
"""


@pytest.mark.slow
def test_a_process_ends_without_the_teardown_that_aborts_with_a_busy_gloo_worker(tmp_path):
    """The rare abort (-6) of a rank at the end of ``composer -n 2 scripts/evaluate.py``: gloo's worker threads still
    holding collectives when the interpreter tears itself down. With collectives left running, ``sys.exit`` instead
    of ``exit_process`` aborted 7 and 9 of 10 processes (torch 2.11, 2.15), 1 to 6 of 6 under load; exit_process
    (scripts/evaluate.py's end) flushes the output and skips the teardown (its atexit handlers)."""
    (tmp_path / 'busy.py').write_text(BUSY_GLOO_AT_EXIT)
    for _ in range(3):
        ended = subprocess.run([sys.executable, str(tmp_path / 'busy.py')], cwd=REPO, capture_output=True, text=True,
                               env={**os.environ, 'PYTHONPATH': REPO})
        assert (ended.returncode, ended.stdout) == (0, 'results written'), ended.stderr[-2000:]


def last_line(stderr: str) -> str:
    """The error line (datasets may draw its progress above it while the harness loads a task)."""
    return stderr.strip().splitlines()[-1]


def test_a_tokenizer_folder_that_is_not_there_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as refused:
        harness_tokenizer(str(tmp_path / 'tokenizer'))
    assert str(refused.value) == (f"{tmp_path / 'tokenizer'}: no such tokenizer folder (a run's relative "
                                  f"data.tokenizer is relative to the folder it trained in); run from there, or give "
                                  f"--tokenizer")


@pytest.mark.slow
def test_bad_evaluate_inputs_are_one_line_before_any_model_is_read(tasks_folder, tokenizer_folder, tmp_path,
                                                                    capsys):
    (tmp_path / 'lost.yaml').write_text(CHOICE_TASK.replace('arithmetic_choice', 'lost_data').format(
        data=str(tmp_path / 'missing.jsonl')))
    generation = tmp_path / 'generation'
    generation.mkdir()
    (generation / 'sums.yaml').write_text(NEXT_WORDS_TASK.replace('next_words', 'sums_sampled').replace(
        'do_sample: false', 'temperature: 0.7').format(data=write_jsonl(generation / 'sums.jsonl', sentences(5))))
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'sums.yaml').write_text('task: sums\ndataset_path: json\n  output_type: [multiple_choice\n')
    cases = [
        (['--tasks', 'sums', '--include', str(broken)],
         f'error: {broken}/sums.yaml: not a valid task YAML: mapping values are not allowed here at line 3, column 14; '
         f'fix the file or move it out of the include path'),
        (['--tasks', 'no_such_task', '--include', tasks_folder],
         f"error: --tasks: 'no_such_task' is neither one of the harness's tasks nor in --include ({tasks_folder}); "
         f"check the name (lm_eval ls tasks)"),
        (['--tasks', 'arithmetic_choice', '--include', str(tmp_path / 'nowhere')],
         f'error: --include: {tmp_path}/nowhere: no such task file or folder; give harness task YAMLs (or a folder '
         f'of them)'),
        (['--tasks', 'lost_data', '--include', str(tmp_path / 'lost.yaml')],
         "error: --tasks: task 'lost_data' cannot be loaded (FileNotFoundError: Unable to find "
         f"'{tmp_path}/missing.jsonl'); put its data on disk and point the task at it (dataset_path: json, "
         "data_files)"),
        (['--tasks', 'sums_sampled', '--include', str(generation)],
         "error: --tasks: task 'sums_sampled' samples its generations (do_sample or a temperature above 0); only "
         "greedy decoding runs here: set do_sample: false in its generation_kwargs"),
    ]
    weights = tmp_path / 'weights'  # a weights folder by its config file; its weights would be read after the tasks
    weights.mkdir()
    (weights / 'config.json').write_text('{}')
    for arguments, message in cases:
        assert evaluate_main([str(weights), *arguments]) == 2
        assert last_line(capsys.readouterr().err) == message
    # a source that is not there is named first, before any task loads (a hub's, over the network)
    assert evaluate_main([str(tmp_path / 'no-model'), '--tasks', 'no_such_task', '--include', tasks_folder]) == 2
    assert last_line(capsys.readouterr().err) == (
        f'error: {tmp_path}/no-model: no latest-rank0.pt link and not a checkpoint; give the save folder of a run or '
        f'one checkpoint (ep0-ba100/ or ep0-ba100-rank0.pt)')


def test_local_tasks_load_without_indexing_the_harnesss_own_and_a_group_of_its_tasks_with_them(tasks_folder, tmp_path,
                                                                                                 monkeypatch):
    """Indexing the harness's ~14,000 task YAMLs cost every rank seconds: tasks found in the include folders load
    from those alone; a local group of tasks they lack loads once the harness's own are indexed (here a stand-in:
    its tasks are ``tasks_folder``'s)."""
    import lm_eval.tasks
    managers = []

    class Recorded(TaskManager):
        def __init__(self, include_path=None, include_defaults=True):
            managers.append(include_defaults)
            own = [tasks_folder] if include_defaults else []
            super().__init__(include_path=[*(include_path or []), *own], include_defaults=False)

    monkeypatch.setattr(lm_eval.tasks, 'TaskManager', Recorded)
    assert llmfoundry_ext.downstream.load_tasks(['arithmetic_choice'], [tasks_folder])[1] == {'arithmetic_choice': 240}
    assert managers == [False]
    (tmp_path / 'suite.yaml').write_text('group: suite\ntask:\n  - last_word\n')
    managers.clear()
    assert llmfoundry_ext.downstream.load_tasks(['suite'], [str(tmp_path / 'suite.yaml')])[1] == {'suite': 120}
    assert managers == [False, True]


def test_a_misspelt_name_or_missing_data_is_reported_without_indexing_the_harnesss_tasks(tasks_folder, tmp_path,
                                                                                         monkeypatch):
    """The harness's ~14,000 task YAMLs are indexed only to load one of its tasks: a name that is neither local nor
    among its names (kept on disk, ``harness_task_names``) and a local task without its data fail from the include
    folders alone."""
    import lm_eval.tasks
    managers = []

    class Recorded(TaskManager):
        def __init__(self, include_path=None, include_defaults=True):
            managers.append(include_defaults)
            super().__init__(include_path=include_path, include_defaults=False)

    monkeypatch.setattr(lm_eval.tasks, 'TaskManager', Recorded)
    monkeypatch.setattr(llmfoundry_ext.downstream, 'harness_task_names', lambda: frozenset({'hellaswag'}))
    with pytest.raises(ConfigError, match="^--tasks: 'hellaswag_local' is neither one of the harness's tasks nor"):
        llmfoundry_ext.downstream.load_tasks(['hellaswag_local'], [tasks_folder])
    (tmp_path / 'lost.yaml').write_text(CHOICE_TASK.replace('arithmetic_choice', 'lost_data').format(
        data=str(tmp_path / 'missing.jsonl')))
    with pytest.raises(ConfigError, match="^--tasks: task 'lost_data' cannot be loaded \\(FileNotFoundError"):
        llmfoundry_ext.downstream.load_tasks(['lost_data'], [str(tmp_path / 'lost.yaml')])
    assert managers == [False, False]


def test_the_harnesss_task_names_are_indexed_once_and_then_read_from_disk(tasks_folder, tmp_path, monkeypatch):
    import lm_eval.tasks
    managers = []

    class Recorded(TaskManager):  # the harness's own tasks stood in for by tasks_folder's
        def __init__(self, include_path=None, include_defaults=True):
            managers.append(include_defaults)
            super().__init__(include_path=[tasks_folder], include_defaults=False)

    monkeypatch.setattr(lm_eval.tasks, 'TaskManager', Recorded)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
    names = llmfoundry_ext.downstream.harness_task_names
    names.cache_clear()
    try:
        first = names()
        names.cache_clear()
        assert (names(), managers) == (first, [True])  # the second process's look-up: the file, no index
    finally:
        names.cache_clear()
    assert {'arithmetic_choice', 'last_word'} <= first
    assert [path.name.endswith('-task-names.json') for path in (tmp_path / 'llmfoundry_ext').iterdir()] == [True]


@pytest.mark.slow
def test_bad_downstream_sections_are_one_line_before_training(tiny_config, tmp_path, tasks_folder, tokenizer_folder,
                                                              monkeypatch):
    bare = tmp_path / 'bare-tokenizer'
    bare.mkdir()
    (bare / 'tokenizer.json').write_text(open(f'{tokenizer_folder}/tokenizer.json').read())
    tiny_config['data']['tokenizer'] = tokenizer_folder
    section = {'tasks': ['arithmetic_choice'], 'include': [tasks_folder], 'interval': '10ba'}
    cases = [
        (change('downstream', {**section, 'tasks': []}),
         "downstream.tasks: name at least one task (the harness's, or one of downstream.include's YAMLs), or set "
         "downstream=null"),
        (change('downstream', {**section, 'interval': '2ep'}),
         'downstream.interval: 2ep (default eval_interval) is not a number of batches; give e.g. 1000ba'),
        (change('downstream', {**section, 'tasks': ['hellaswag_local']}),
         f"downstream.tasks: 'hellaswag_local' is neither one of the harness's tasks nor in downstream.include "
         f"({tasks_folder}); check the name (lm_eval ls tasks)"),
        (changes(('downstream', section), ('data.tokenizer', 'DELETE')),
         "downstream: needs data.tokenizer (the harness tokenizes the tasks' text with it); set data.tokenizer"),
        (changes(('downstream', section), ('data.tokenizer', str(bare))),
         f"{bare}: no tokenizer_config.json naming the tokenizer's eos_token (and bos_token, if it has one); add "
         f"one, or use a tokenizer folder that has it"),
    ]
    for mutate, message in cases:
        assert config_error(prepare, tiny_config, tmp_path, mutate) == message
    monkeypatch.setattr('llmfoundry_ext.downstream.harness_utils', None)  # as without the eval extra
    assert config_error(prepare, tiny_config, tmp_path, change('downstream', section)) == (
        "downstream evaluation needs lm-evaluation-harness, which is not installed: pip install "
        "'llmfoundry_ext[eval]'")


METRICS = ('arithmetic_choice/acc', 'arithmetic_choice/acc_norm', 'last_word/acc', 'last_word/perplexity')


def run_in(config: dict, folder, downstream: dict | None, save_every: int = 50) -> dict:
    """``config`` saving under ``folder`` (checkpoints every ``save_every`` batches, the sample ledger), with
    ``downstream``."""
    config = {**config, 'checkpoint': {'save_folder': str(folder / 'checkpoints'),
                                       'save_interval': f'{save_every}ba'},
              'callbacks': {'sample_ledger': {'folder': str(folder / 'ledger')}}}
    if downstream:
        config['downstream'] = downstream
    return config


def downstream_metrics(results: dict) -> dict[str, float]:
    return {f'{task}/{key.split(",")[0]}': value for task, values in results['results'].items()
            for key, value in values.items() if f'{task}/{key.split(",")[0]}' in METRICS}


def in_loop(folder, batch: int) -> dict[str, float]:
    return downstream_metrics(json.loads((folder / 'checkpoints' / 'downstream' / f'ba{batch}.json').read_text()))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_in_loop_metrics_are_the_checkpoints_and_training_is_untouched(texts_config, tasks_folder, tmp_path,
                                                                         capsys, monkeypatch):
    """...and the tasks are loaded once, by preflight, for the whole run (100 batches, evaluated at 50 and 100)."""
    downstream = {'tasks': ['arithmetic_choice', 'last_word'], 'include': [tasks_folder], 'interval': '50ba'}
    texts_config['max_duration'] = '100ba'
    train(prepare(write_yaml(run_in(texts_config, tmp_path / 'plain', None), tmp_path / 'plain.yaml'))).close()
    loads, load_tasks = [], llmfoundry_ext.downstream.load_tasks
    monkeypatch.setattr(llmfoundry_ext.downstream, 'load_tasks', lambda *args: loads.append(args[:2]) or load_tasks(*args))
    train(prepare(write_yaml(run_in(texts_config, tmp_path / 'with', downstream), tmp_path / 'with.yaml'))).close()
    assert loads == [(['arithmetic_choice', 'last_word'], [tasks_folder])]
    output = capsys.readouterr().out
    assert read_ledger(str(tmp_path / 'with' / 'ledger' / 'ledger-rank0.jsonl')) == read_ledger(
        str(tmp_path / 'plain' / 'ledger' / 'ledger-rank0.jsonl'))
    assert '  downstream every 50 batches: arithmetic_choice (240 examples), last_word (120 examples)' in output
    assert output.count('downstream at batch ') == 2
    for batch in (50, 100):
        checkpoint, = (tmp_path / 'with' / 'checkpoints').glob(f'ep*-ba{batch}-rank0.pt')  # the texts loop
        assert evaluate_main([str(checkpoint), '--tasks',
                              'arithmetic_choice', 'last_word', '--include', tasks_folder, '--json',
                              str(tmp_path / f'ba{batch}.json')]) == 0
        offline = downstream_metrics(json.loads((tmp_path / f'ba{batch}.json').read_text()))
        assert in_loop(tmp_path / 'with', batch) == pytest.approx(offline, rel=1e-6, abs=0)
    trail = ', '.join(f"{batch} {in_loop(tmp_path / 'with', batch)['arithmetic_choice/acc']:.4f}"
                      for batch in (50, 100))
    assert f'  arithmetic_choice/acc by batch: {trail}' in output


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_processes_under_fsdp2_in_the_loop_give_the_hf_backends_scores_2_shot_and_generated(
        texts_config, tasks_folder, tmp_path):
    """Two processes under the launcher, the tasks 2-shot and the generation task with them, evaluated at batches 50
    and 100; the scores at 100 beside the harness's HF backend on that checkpoint exported."""
    downstream = {'tasks': TASKS, 'include': [tasks_folder], 'interval': '50ba', 'num_fewshot': 2}
    texts_config.update(parallelism={'fsdp': {'state_dict_type': 'sharded'}}, max_duration='100ba')
    yaml = write_yaml(run_in(texts_config, tmp_path / 'run', downstream), tmp_path / 'run.yaml')
    run = subprocess.run([*FORKED, '-n', '2', 'train.py', yaml], cwd=REPO, capture_output=True, text=True,
                         timeout=600, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert run.returncode == 0, run.stderr[-3000:]
    export_to_hf(str(tmp_path / 'run' / 'checkpoints'), str(tmp_path / 'hf'), torch.float32)
    theirs = evaluate(tasks_folder, 'hf', {'pretrained': str(tmp_path / 'hf'), 'dtype': 'float32'}, TASKS, 2)
    assert_same_scores(json.loads((tmp_path / 'run' / 'checkpoints' / 'downstream' / 'ba100.json').read_text()),
                       theirs)


STALLED_EVALUATION = '''
import os, sys, time
if sys.argv[0].endswith('train.py'):  # the rank, not the launcher or its resource tracker
    import llmfoundry_ext.downstream as downstream
    def _stalled(*args, **kwargs):  # the run is killed in here
        open(os.environ['EVALUATING'], 'w').close()
        time.sleep(600)
    downstream.run_tasks = _stalled
'''


def saved_batches(folder) -> list[int]:
    return sorted({int(match[1]) for name in os.listdir(folder) if (match := re.match(r'ep\d+-ba(\d+)', name))})


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_kill_during_an_evaluation_loses_no_checkpoint_and_the_resumed_run_evaluates_as_the_uninterrupted(
        texts_config, tasks_folder, tmp_path, capsys):
    """kill -9 inside the evaluation at batch 50 (before that batch's checkpoint: the evaluation runs at the batch's
    end, Composer's checkpoint after it); the same command again (here, what ``train.py`` runs, in this process)
    resumes at batch 25 and both evaluations (50, 100) equal the uninterrupted run's."""
    downstream = {'tasks': ['arithmetic_choice', 'last_word'], 'include': [tasks_folder], 'interval': '50ba'}
    texts_config['max_duration'] = '100ba'
    train(prepare(write_yaml(run_in(texts_config, tmp_path / 'whole', downstream, save_every=25),
                             tmp_path / 'whole.yaml'))).close()
    yaml = write_yaml(run_in(texts_config, tmp_path / 'killed', downstream, save_every=25), tmp_path / 'killed.yaml')
    hooks = tmp_path / 'hooks'
    hooks.mkdir()
    (hooks / 'sitecustomize.py').write_text(STALLED_EVALUATION)
    evaluating = tmp_path / 'evaluating'
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'EVALUATING': str(evaluating)}
    command = [*LAUNCHER, '-n', '1', 'train.py', yaml]
    with open(tmp_path / 'killed.log', 'w') as log:
        run = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**env, 'PYTHONPATH': os.pathsep.join([str(hooks), REPO])})
        deadline = time.monotonic() + 600
        while not evaluating.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    checkpoints = tmp_path / 'killed' / 'checkpoints'
    assert evaluating.exists() and saved_batches(checkpoints) == [25], (tmp_path / 'killed.log').read_text()[-2000:]
    capsys.readouterr()
    assert train_main([yaml]) == 0
    assert 'autoresume: resuming from the latest checkpoint at batch 25' in capsys.readouterr().out
    assert saved_batches(checkpoints) == [25, 50, 75, 100]
    for batch in (50, 100):
        assert in_loop(tmp_path / 'killed', batch) == in_loop(tmp_path / 'whole', batch)
