"""Autoresume never loads a broken checkpoint: each corruption falls back to the newest complete one with one line,
moving the broken one aside; a non-finite loss or weights stop the run before they are checkpointed; a full disk
during a checkpoint write is one line and the re-run resumes."""
import contextlib
import errno
import os
import pickle
import shutil
import subprocess

import pytest
import torch
from composer.core import Callback
from filelock import FileLock

from llmfoundry_ext.data.mds import file_sha256
from llmfoundry_ext.errors import TrainingStopped
from llmfoundry_ext.resumption import LATEST, SEAL, prepare_autoresume, problem, seal
from llmfoundry_ext.train import main, train
from llmfoundry_ext.preflight import prepare
from tests.conftest import FORKED, REPO, write_yaml


@pytest.fixture(scope='session')
def two_rank_run(tmp_path_factory, tiny_streams, worker_id) -> str:
    """The save folder of a 2-process FSDP2 run with sharded checkpoints at batches 5 and 10, once a session: under
    make test the first worker to need it runs it, holding a lock, in the folder the workers share, and the other
    finds it there (pytest-xdist's recipe for a session fixture run once; the tests copy it)."""
    if worker_id == 'master':  # not under xdist
        return run_two_ranks(tmp_path_factory.mktemp('run'), tiny_streams['a'])
    shared = tmp_path_factory.getbasetemp().parent
    folder, done = shared / 'two_rank_run', shared / 'two_rank_run.done'
    with FileLock(str(shared / 'two_rank_run.lock')):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a failed attempt's
            folder.mkdir()
            run_two_ranks(folder, tiny_streams['a'])
            done.touch()
    return str(folder / 'checkpoints')


def run_two_ranks(folder, stream: str) -> str:
    import yaml
    config = {
        'run_name': 'tiny', 'max_seq_len': 32, 'global_batch_size': 8, 'max_duration': '10ba', 'precision': 'fp32',
        'model': {'preset': 'debug', 'dim': 64, 'n_layers': 2, 'n_heads': 4, 'n_kv_heads': 2, 'ffn_dim': 128,
                  'vocab_size': 512, 'max_seq_len': 64},
        'data': {'train': {'streams': {'a': {'local': stream}}}},
        'checkpoint': {'save_folder': str(folder / 'checkpoints'), 'save_interval': '5ba'},
        'loggers': {}, 'progress_bar': False}
    (folder / 'run.yaml').write_text(yaml.safe_dump(config))
    run = subprocess.run([*FORKED, '-n', '2', 'train.py', str(folder / 'run.yaml')], cwd=REPO, capture_output=True,
                         text=True, timeout=600, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert run.returncode == 0, run.stderr[-3000:]
    return str(folder / 'checkpoints')


def copy_of(run: str, tmp_path) -> str:
    return shutil.copytree(run, tmp_path / 'checkpoints', symlinks=True)


def truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


def flip_a_byte(path: str) -> None:
    data = bytearray(open(path, 'rb').read())
    data[len(data) // 2] ^= 0x01
    open(path, 'wb').write(bytes(data))


CORRUPTIONS = {  # damage done to ep0-ba10 -> the reason given for skipping it
    'truncated shard': (lambda ckpt: truncate(f'{ckpt}/__1_0.distcp'), '__1_0.distcp has {size} bytes where {written} '
                                                                       'were written'),
    'missing rank shard': (lambda ckpt: os.remove(f'{ckpt}/__1_0.distcp'), '__1_0.distcp is missing'),
    'flipped byte in the metadata': (lambda ckpt: flip_a_byte(f'{ckpt}/.metadata'),
                                     '.metadata differs from what was written (sha256)'),
    'half-written folder': (lambda ckpt: os.remove(f'{ckpt}/.metadata'), 'no .metadata: its write was interrupted'),
}


@pytest.mark.parametrize('case', CORRUPTIONS)
def test_each_corruption_falls_back_to_the_newest_complete_checkpoint(two_rank_run, tmp_path, case):
    folder = copy_of(two_rank_run, tmp_path)
    newest = f'{folder}/ep0-ba10'
    written = os.path.getsize(f'{newest}/__1_0.distcp')
    damage, reason = CORRUPTIONS[case]
    damage(newest)
    size = os.path.getsize(f'{newest}/__1_0.distcp') if os.path.exists(f'{newest}/__1_0.distcp') else 0
    lines = prepare_autoresume(folder, sharded=True)
    reason = reason.format(size=f'{size:,}', written=f'{written:,}')
    assert lines == [f'autoresume: skipped checkpoint ep0-ba10 ({reason}); moved it to ep0-ba10.broken, resuming from '
                     f'ep0-ba5']
    assert os.readlink(f'{folder}/{LATEST}') == 'ep0-ba5'
    assert sorted(name for name in os.listdir(folder) if name != 'config.yaml') == [
        'ep0-ba10.broken', 'ep0-ba5', LATEST]


def test_a_checkpoint_written_before_seals_is_checked_against_its_metadata(two_rank_run, tmp_path):
    folder = copy_of(two_rank_run, tmp_path)
    os.remove(f'{folder}/ep0-ba10/{SEAL}')
    assert problem(f'{folder}/ep0-ba10') is None
    truncate(f'{folder}/ep0-ba10/__0_0.distcp')
    with open(f'{folder}/ep0-ba10/.metadata', 'rb') as file:
        end = max(info.offset + info.length for info in pickle.load(file).storage_data.values()
                  if info.relative_path == '__0_0.distcp')
    size = os.path.getsize(f'{folder}/ep0-ba10/__0_0.distcp')
    assert problem(f'{folder}/ep0-ba10') == f'__0_0.distcp has {size:,} bytes where {end:,} were written'


def test_a_whole_model_checkpoint_in_a_relative_folder_is_sealed_and_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs('run')
    torch.save({'state': {'model': {'w': torch.ones(1000)}}}, 'run/ep0-ba2-rank0.pt')
    seal('run/ep0-ba2-rank0.pt')
    assert os.path.isfile(f'run/.ep0-ba2-rank0.pt{SEAL}') and problem('run/ep0-ba2-rank0.pt') is None
    size = os.path.getsize('run/ep0-ba2-rank0.pt')
    truncate('run/ep0-ba2-rank0.pt')
    assert problem('run/ep0-ba2-rank0.pt') == f'ep0-ba2-rank0.pt has {size // 2:,} bytes where {size:,} were written'
    os.remove(f'run/.ep0-ba2-rank0.pt{SEAL}')
    assert problem('run/ep0-ba2-rank0.pt') == 'not a complete torch.save archive (truncated?)'


def test_a_missing_latest_link_points_at_the_newest_checkpoint(two_rank_run, tmp_path):
    """Composer removes the link, then re-creates it: a kill in between left none, and the run started over."""
    folder = copy_of(two_rank_run, tmp_path)
    os.remove(f'{folder}/{LATEST}')
    assert prepare_autoresume(folder, sharded=True) == []
    assert os.readlink(f'{folder}/{LATEST}') == 'ep0-ba10'


def test_a_sharded_checkpoint_is_converted_for_one_process_once_and_holds_the_same_tensors(two_rank_run, tmp_path):
    """One process reads one file: the newest folder is converted beside it (kept), sealed; a later run of either
    format finds its own, converting nothing again."""
    from llmfoundry_ext.checkpoint import read_composer_model
    folder = copy_of(two_rank_run, tmp_path)
    assert prepare_autoresume(folder, sharded=False) == [
        'autoresume: ep0-ba10 is sharded, this run reads one file: converted it to ep0-ba10-rank0.pt (kept ep0-ba10)']
    assert os.readlink(f'{folder}/{LATEST}') == 'ep0-ba10-rank0.pt' and problem(f'{folder}/ep0-ba10-rank0.pt') is None
    assert os.path.isfile(f'{folder}/.ep0-ba10-rank0.pt{SEAL}')
    whole, shards = read_composer_model(f'{folder}/ep0-ba10-rank0.pt'), read_composer_model(f'{folder}/ep0-ba10')
    assert sorted(whole) == sorted(shards) and len(whole) == 21  # 2 blocks of 9, embeddings, norm, output
    assert all(torch.equal(whole[name], shards[name]) for name in shards)
    assert prepare_autoresume(folder, sharded=True) == [] and os.readlink(f'{folder}/{LATEST}') == 'ep0-ba10'
    assert prepare_autoresume(folder, sharded=False) == [] and os.readlink(f'{folder}/{LATEST}') == 'ep0-ba10-rank0.pt'


def test_checkpoints_beyond_the_number_to_keep_are_pruned_across_restarts_and_the_newest_set_aside_kept(tmp_path):
    """Composer counts only what its own run saved; a folder restarted many times kept every earlier run's."""
    folder = str(tmp_path)
    for batch in (2, 4, 6, 8, 10):
        torch.save({'batch': batch}, f'{folder}/ep0-ba{batch}-rank0.pt')
        seal(f'{folder}/ep0-ba{batch}-rank0.pt')
    for name in ('ep0-ba12-rank0.pt.broken', 'ep0-ba12-rank0.pt.broken-2', 'ep0-ba14-rank0.pt.broken',
                 f'.ep0-ba1-rank0.pt{SEAL}'):  # the last: the seal of a file Composer's rotation removed
        open(f'{folder}/{name}', 'wb').close()
    assert prepare_autoresume(folder, sharded=False, keep=2) == [
        'autoresume: removed 3 checkpoints beyond checkpoint.save_num_checkpoints_to_keep (2) and 2 older set-aside '
        'ones; kept ep0-ba14-rank0.pt.broken to inspect']
    assert sorted(os.listdir(folder)) == [f'.ep0-ba10-rank0.pt{SEAL}', f'.ep0-ba8-rank0.pt{SEAL}', 'ep0-ba10-rank0.pt',
                                          'ep0-ba14-rank0.pt.broken', 'ep0-ba8-rank0.pt', LATEST]
    assert prepare_autoresume(folder, sharded=False, keep=2) == []  # nothing more to remove


def test_with_no_complete_checkpoint_left_the_run_stops_and_moves_nothing(two_rank_run, tmp_path):
    folder = copy_of(two_rank_run, tmp_path)
    flip_a_byte(f'{folder}/ep0-ba10/.metadata')
    os.remove(f'{folder}/ep0-ba5/__0_0.distcp')
    with pytest.raises(TrainingStopped) as stopped:
        prepare_autoresume(folder, sharded=True)
    assert str(stopped.value) == (
        f'autoresume: no complete checkpoint in {folder} (ep0-ba10: .metadata differs from what was written (sha256); '
        f'ep0-ba5: __0_0.distcp is missing); move them out of the folder to start from scratch, or set '
        f'checkpoint.load_path')
    assert sorted(name for name in os.listdir(folder) if name != 'config.yaml') == ['ep0-ba10', 'ep0-ba5', LATEST]


def test_an_interrupted_first_checkpoint_is_moved_aside_and_the_run_starts_over(two_rank_run, tmp_path):
    """It was never complete: nothing is lost by starting from scratch."""
    folder = copy_of(two_rank_run, tmp_path)
    shutil.rmtree(f'{folder}/ep0-ba10')
    os.remove(f'{folder}/{LATEST}')
    os.remove(f'{folder}/ep0-ba5/.metadata')
    os.remove(f'{folder}/ep0-ba5/{SEAL}')
    assert prepare_autoresume(folder, sharded=True) == [
        'autoresume: skipped checkpoint ep0-ba5 (no .metadata: its write was interrupted); moved it to ep0-ba5.broken, '
        'starting from scratch (no checkpoint was complete)']
    assert not os.path.lexists(f'{folder}/{LATEST}')


class PoisonWeights(Callback):
    """Sets a weight to NaN: at the start of batch ``at`` (its loss is NaN), or at its end (after the step)."""

    def __init__(self, at: int, event: str):
        self.at, self.event = at, event

    def run_event(self, event, state, logger):
        if event.value == self.event and int(state.timestamp.batch) + (self.event == 'batch_start') == self.at:
            with torch.no_grad():
                next(state.model.parameters()).fill_(float('nan'))


@pytest.mark.parametrize('event, message', [
    ('batch_start', 'non-finite training loss nan at batch 6: stopped before checkpointing it; the same command '
                    'resumes from the last checkpoint (lower the learning rate or check the data first)'),
    ('batch_end', 'non-finite weights at batch 6: not writing checkpoint ep0-ba6-rank0.pt; the same command resumes '
                  'from the last checkpoint (lower the learning rate or check the data first)')])
def test_non_finite_loss_or_weights_stop_before_the_checkpoint(tiny_config, tmp_path, event, message, capsys):
    tiny_config.update(max_duration='8ba', loggers={})
    tiny_config['checkpoint']['save_interval'] = '2ba'
    path = write_yaml(tiny_config, tmp_path / 'run.yaml')
    with pytest.raises(TrainingStopped) as stopped:
        train(prepare(path), extra_callbacks=[PoisonWeights(6, event)])
    assert str(stopped.value) == message
    folder = tmp_path / 'checkpoints' / 'tiny'
    assert sorted(name for name in os.listdir(folder) if name.startswith('ep')) == ['ep0-ba2-rank0.pt',
                                                                                     'ep0-ba4-rank0.pt']
    capsys.readouterr()
    assert main([path]) == 0
    assert 'autoresume: resuming from the latest checkpoint at batch 4' in capsys.readouterr().out
    assert os.readlink(folder / LATEST) == 'ep0-ba8-rank0.pt'


@contextlib.contextmanager
def disk_full_for(marker: str):
    """torch.distributed.checkpoint's file writes into a path containing ``marker`` fail with ENOSPC."""
    from torch.distributed.checkpoint.filesystem import FileSystem
    original = FileSystem.create_stream

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        if marker in str(path) and 'w' in mode:
            open(path, 'wb').close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        with original(self, path, mode) as stream:
            yield stream

    FileSystem.create_stream = create_stream
    try:
        yield
    finally:
        FileSystem.create_stream = original


def disk_full_line(folder, name: str) -> str:
    """The line, its sizes read as the saver reads them (the newest checkpoint left, the free space now)."""
    from llmfoundry_ext.checkpoint_saver import human_bytes, size_of
    newest = max((entry for entry in os.listdir(folder) if entry.startswith('ep0-ba')),
                 key=lambda entry: int(entry.split('-ba')[1].split('-')[0]))
    return (f'error: no space left on the device while writing checkpoint {folder}/{name} '
            f'({human_bytes(shutil.disk_usage(folder).free)} free in {folder}, a checkpoint takes '
            f'{human_bytes(size_of(os.path.join(folder, newest)))}; the partial checkpoint was removed): free space, '
            f'then run the same command; it resumes from the newest complete checkpoint')


@contextlib.contextmanager
def disk_full_saving(marker: str):
    """torch.save into a path containing ``marker`` writes 1,000 bytes, then fails with ENOSPC (a full disk), as torch
    2.11 does on an H200's full disk: its zip writer, closing after the failed write, raises a RuntimeError of its
    own while the OSError is handled."""
    original = torch.save

    def save(obj, f, *args, **kwargs):
        if marker in str(getattr(f, 'name', f)):  # a path, or the file Composer opened
            with open(f, 'wb') if isinstance(f, (str, os.PathLike)) else contextlib.nullcontext(f) as file:
                file.write(bytes(1000))
            try:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError:
                raise RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 1064 vs 1000')
        return original(obj, f, *args, **kwargs)

    torch.save = save
    try:
        yield
    finally:
        torch.save = original


def test_a_full_disk_writing_one_file_leaves_nothing_under_its_name(tiny_config, tmp_path, capsys):
    tiny_config.update(max_duration='8ba', loggers={})
    tiny_config['checkpoint']['save_interval'] = '2ba'
    tiny_config['parallelism'] = {'fsdp': None}
    path = write_yaml(tiny_config, tmp_path / 'run.yaml')
    folder = tmp_path / 'checkpoints' / 'tiny'
    with disk_full_saving('ep0-ba6-rank0.pt'):
        assert main([path, 'max_duration=4ba']) == 0
        capsys.readouterr()
        assert main([path]) == 1
    stderr = capsys.readouterr().err
    assert [line for line in stderr.splitlines() if line.startswith('error')] == [
        disk_full_line(folder, 'ep0-ba6-rank0.pt')]
    assert not [name for name in os.listdir(folder) if name.startswith('ep0-ba6')]  # nor a partial one
    assert main([path]) == 0
    assert 'autoresume: resuming from the latest checkpoint at batch 4' in capsys.readouterr().out


def test_a_full_disk_while_checkpointing_is_one_line_and_the_rerun_resumes(tiny_config, tmp_path, capsys,
                                                                           fsdp_on_one_process):
    tiny_config.update(max_duration='8ba', loggers={})
    tiny_config['checkpoint']['save_interval'] = '2ba'
    path = write_yaml(tiny_config, tmp_path / 'run.yaml')
    folder = tmp_path / 'checkpoints' / 'tiny'
    with disk_full_for('ep0-ba6'):
        assert main([path, 'max_duration=4ba']) == 0
        before = {name: file_sha256(folder / 'ep0-ba4' / name) for name in os.listdir(folder / 'ep0-ba4')}
        capsys.readouterr()
        assert main([path]) == 1
    stderr = capsys.readouterr().err  # Composer's console log is there too
    assert [line for line in stderr.splitlines() if line.startswith('error')] == [disk_full_line(folder, 'ep0-ba6')]
    assert 'Traceback' not in stderr and not os.path.exists(folder / 'ep0-ba6')
    assert {name: file_sha256(folder / 'ep0-ba4' / name) for name in os.listdir(folder / 'ep0-ba4')} == before
    assert main([path]) == 0
    out = capsys.readouterr().out
    assert 'autoresume: resuming from the latest checkpoint at batch 4' in out
    assert os.readlink(folder / LATEST) == 'ep0-ba8'
