"""stop_after ends an invocation early with a checkpoint; the same config then resumes and finishes."""
import os

from llmfoundry_ext.train import train
from llmfoundry_ext.preflight import prepare
from tests.conftest import write_yaml


def test_stop_after_saves_and_the_rerun_resumes(tiny_config, tmp_path, capsys):
    tiny_config['parallelism'] = {'fsdp': None}
    tiny_config['max_duration'] = '6ba'
    path = write_yaml(tiny_config, tmp_path / 'run.yaml')

    first = train(prepare(path, ['callbacks.stop_after.batches=4']))
    assert int(first.state.timestamp.batch) == 4
    first.close()
    assert os.path.islink(tmp_path / 'checkpoints' / 'tiny' / 'latest-rank0.pt')

    second = train(prepare(path))
    assert int(second.state.timestamp.batch) == 6
    second.close()
    output = capsys.readouterr().out
    assert 'starting from scratch (no checkpoint found)' in output
    assert 'autoresume: resuming from the latest checkpoint at batch 4' in output

    third = train(prepare(path))  # a finished run re-submitted: nothing to do, and no error
    assert int(third.state.timestamp.batch) == 6
    third.close()
    assert 'run tiny is already complete (6ba); nothing to train. Raise max_duration to train further.' in \
        capsys.readouterr().out
