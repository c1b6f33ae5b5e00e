"""The demo's downstream task: held-out code lines' next lines among four, which the harness loads from local
files; the downstream benchmark's task over the learning corpus' held-out source."""
import json
import os

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from data_prep.demo_corpus import next_line_questions, write_demo_task, write_held_out_task
from llmfoundry_ext.measure.learning import held_out_pieces, write_corpus
from llmfoundry_ext.downstream import load_tasks

DOCUMENTS = ['\n'.join(f'value_{d}_{i} = {i} * {d}' for i in range(6 + d % 3)) for d in range(20)]


def test_next_line_questions_put_the_real_next_line_among_three_of_other_documents():
    questions = next_line_questions(DOCUMENTS, 40)
    assert questions == next_line_questions(DOCUMENTS, 40)  # deterministic
    for question in questions:
        context = question['context'].splitlines()
        lines = next(d.splitlines() for d in DOCUMENTS if context[-1] in d.splitlines())
        assert context == lines[lines.index(context[0]):lines.index(context[0]) + 3]
        choices = question['choices']
        assert len(set(choices)) == 4 and choices[question['answer']] == lines[lines.index(context[-1]) + 1]
        assert all(choice not in lines for index, choice in enumerate(choices) if index != question['answer'])
    assert sorted({q['answer'] for q in questions}) == [0, 1, 2, 3]
    # the draws of the questions behind the README's demo accuracies (a change here changes the demo's task)
    assert questions[1] == {'context': 'value_12_1 = 1 * 12\nvalue_12_2 = 2 * 12\nvalue_12_3 = 3 * 12\n',
                            'choices': ['value_19_5 = 5 * 19', 'value_0_1 = 1 * 0', 'value_14_1 = 1 * 14',
                                        'value_12_4 = 4 * 12'], 'answer': 3}
    assert [q['answer'] for q in questions][:12] == [3, 3, 1, 2, 3, 0, 1, 1, 0, 2, 0, 0]


def test_longer_questions_take_more_context_lines_and_endings_of_as_many_lines():
    questions = next_line_questions(DOCUMENTS, 30, context_lines=4, ending_lines=2)
    for question in questions:
        context = question['context'].splitlines()
        lines = next(d.splitlines() for d in DOCUMENTS if context[-1] in d.splitlines())
        after = lines.index(context[-1]) + 1
        assert len(context) == 4 and question['choices'][question['answer']] == '\n'.join(lines[after:after + 2])
        assert all(len(choice.splitlines()) == 2 for choice in question['choices'])


def test_the_demo_task_loads_through_the_harness_from_its_folder(tmp_path):
    os.makedirs(tmp_path / 'tokenizer')
    write_demo_task(str(tmp_path), questions=30, files=40)
    _, examples = load_tasks(['demo_next_line'], [str(tmp_path / 'tasks')])
    assert examples == {'demo_next_line': 30}
    config = json.loads((tmp_path / 'tokenizer' / 'tokenizer_config.json').read_text())
    assert (config['bos_token'], config['eos_token']) == ('<|begin_of_text|>', '<|end_of_text|>')


def test_the_held_out_task_asks_of_source_the_corpus_left_out_in_questions_the_harness_can_split(tmp_path):
    """Questions of at most max_chars, from the pieces ``write_corpus`` cut off (each line of the tree is unique),
    every choice adding tokens to its context; the task loads through the harness."""
    root = tmp_path / 'src'
    for index in range(6):
        os.makedirs(root / f'pkg{index}')
        (root / f'pkg{index}' / 'module.py').write_text(''.join(
            f'value_{index}_{line} = compute({line}, {index})\n' for line in range(120)))
    folder = tmp_path / 'tokenizer'
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator([(root / 'pkg0' / 'module.py').read_text()], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(folder)
    tokenizer.save(str(folder / 'tokenizer.json'))
    described = write_corpus([str(root)], str(tmp_path / 'corpus'), 0.008)
    data = {'tokenizer': str(folder), 'documents': described['documents']}
    task = write_held_out_task(str(tmp_path), data, [str(root)], 25, 'held_out', max_chars=150)
    assert task['questions'] == 25 and task['yaml'] == str(tmp_path / 'tasks' / 'held_out.yaml')
    assert load_tasks(['held_out'], [str(tmp_path / 'tasks')])[1] == {'held_out': 25}
    corpus = open(tmp_path / 'corpus' / 'all.jsonl').read()
    held_out = '\n'.join(held_out_pieces([str(root)], described['documents']))
    questions = [json.loads(line) for line in open(tmp_path / 'tasks' / 'held_out.jsonl')]
    for question in questions:
        longest = max(map(len, question['choices']))
        assert len(question['context']) + longest <= 150 and question['context'].count('\n') == 2
        assert question['context'] in held_out and question['context'].splitlines()[0] not in corpus
    assert 1 < task['context_tokens'] < task['longest_tokens']
