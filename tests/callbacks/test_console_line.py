import re

from llmfoundry_ext.train import logged_history, train
from llmfoundry_ext.preflight import prepare
from tests.conftest import write_yaml

LINE = re.compile(r'batch (\d)/4  loss (\d+\.\d{4})  lr (\S+)  ([\d,]+) tokens/s/GPU  \d+:\d\d:\d\d elapsed, '
                  r'\d+:\d\d:\d\d left')


def run(tiny_config, tmp_path, capsys, **settings) -> tuple[list[str], list[str], dict]:
    tiny_config.update(parallelism={'fsdp': None}, max_duration='4ba', log_interval='2ba', eval_interval='4ba',
                       loggers={'in_memory': {}}, **settings)
    tiny_config['data']['eval'] = {'streams': {'b': {'local': tiny_config['data']['train']['streams']['b']['local']}}}
    trainer = train(prepare(write_yaml(tiny_config, tmp_path / 'run.yaml')))
    history = logged_history(trainer)
    trainer.close()
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err.splitlines(), history


def test_one_line_per_interval_on_the_console(tiny_config, tmp_path, capsys):
    lines, errors, history = run(tiny_config, tmp_path, capsys)
    printed = [LINE.fullmatch(line) for line in lines if line.startswith(('batch ', 'eval at'))]
    assert [match[1] if match else None for match in printed] == ['2', '4', None]
    losses = {int(t.batch) + 1: float(v) for t, v in history['loss/train/total']}  # logged before the count moves
    assert [float(match[2]) for match in printed[:2]] == [round(losses[2], 4), round(losses[4], 4)]
    eval_loss = float(history['metrics/eval/LanguageCrossEntropy'][-1][1])
    assert [line for line in lines if line.startswith('eval at')] == [f'eval at batch 4  loss {eval_loss:.4f}']
    assert not any('Train loss/train/total' in line for line in lines + errors)


def test_console_full_is_composers_dump(tiny_config, tmp_path, capsys):
    lines, errors, _ = run(tiny_config, tmp_path, capsys, console='full', progress_bar=False)
    assert not any(LINE.fullmatch(line) for line in lines + errors)
    assert sum('Train loss/train/total: ' in line for line in errors) == 3  # stderr; batches 1, 2 and 4
