"""scripts/plan.py: the table of a shipped YAML on a described cluster, its JSON, and a refused YAML."""
import json
import os

from scripts.plan import main
from tests.conftest import REPO


def test_the_8b_on_256_h100s_gets_a_table_its_choice_and_the_time_to_1t_tokens(tmp_path, capsys):
    before = {name: os.environ.get(name) for name in ('WORLD_SIZE', 'LOCAL_WORLD_SIZE')}
    out = tmp_path / 'plan.json'
    assert main([os.path.join(REPO, 'yamls/llama8b.yaml'), '--gpus', '256', '--gpu', 'h100', '--json', str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == 'on 256 x NVIDIA H100 80GB HBM3 (79.2 GiB; 32 nodes), 2 samples a GPU a step'
    assert lines[3].split() == ['micro', 'checkpointing', 'reshard', 'float8', 'peak', 'GiB', 'fits', 'tokens/s/GPU',
                                'MFU', 'time', 'to', 'end', 'GPU-hours']
    assert lines[-1] == '1T tokens: 4.8 days on 256 GPUs (29,595 GPU-hours)'
    rows = json.loads(out.read_text())['rows']
    assert len(rows) == 2 * 3 * 2  # micro-batch 1 and 2, three modes, resharding; auto weighs no float8 (FLOAT8_FAMILIES)
    assert [row for row in rows if row['chosen']] == [rows[1]]  # the fastest that fits: micro-batch 2 does not
    assert {name: os.environ.get(name) for name in before} == before  # this process's launch as it was
    assert (rows[1]['micro_batch'], rows[1]['checkpointing'], rows[1]['reshard_after_forward'], rows[1]['float8'],
            rows[1]['peak_gib'], rows[1]['fits']) == (1, 'none', False, False, 50.56, True)


def test_a_yaml_whose_settings_do_not_fit_is_refused_with_status_2(capsys):
    code = main([os.path.join(REPO, 'yamls/llama1b.yaml'), 'global_batch_size=8', 'device_microbatch_size=8',
                 'model.float8=true', 'parallelism.fsdp.activation_checkpointing=none',
                 'parallelism.fsdp.reshard_after_forward=false', '--gpus', '1', '--gpu', 'h100'])
    assert code == 2
    assert capsys.readouterr().out.splitlines()[-1] == (
        'the YAML as set is refused: device_microbatch_size: micro-batch 8, checkpointing none, reshard false, float8 '
        'true is predicted to need 105.3 GiB a GPU, more than the 73.5 GiB that fits NVIDIA H100 80GB HBM3 (79.2 GiB, '
        'less 5% and 2.0 GiB outside the allocator); set device_microbatch_size=4 (predicted 64.9 GiB, 61,090 '
        'tokens/s a GPU), or auto')


def test_where_nothing_fits_the_table_still_shows_every_setting(capsys):
    code = main([os.path.join(REPO, 'yamls/llama70b.yaml'), '--gpus', '16', '--gpu', 'h100'])
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines[4:] if line[:7].strip().isdigit()]
    assert code == 2 and len(rows) == 7 * 3 * 2  # 64 samples a GPU: seven micro-batches
    assert {line.split()[5] for line in rows} == {'no'}
    assert lines[-1].endswith('and no setting fits; use more GPUs, parallelism.context_parallel_degree, or a shorter '
                              'max_seq_len')
