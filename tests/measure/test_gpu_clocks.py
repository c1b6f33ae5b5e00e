"""The GPUs' clocks while a row trains: nvidia-smi's lines read beside it, the busy ones summarised."""
import os
import stat
import sys
import time

from llmfoundry_ext.measure import benchmark
from llmfoundry_ext.measure.benchmark import Row
from llmfoundry_ext.measure.gpu_clocks import GpuSampler, format_clocks
from tests.measure.test_benchmark import FAKE_TORCHTITAN

LINES = ['0, 345, 70.10, 31, 0',        # idle before the run: not counted
         '0, 1980, 690.50, 58, 100', '0, 1755, 700.00, 66, 97', '1, 1830, 640.00, 71, 100',
         '0, [N/A], 650.00, 60, 100',   # a value it could not read: dropped
         '1, 1410, 300.00, 62, 40']     # compiling: not counted


def fake_nvidia_smi(folder) -> str:
    """Prints LINES as nvidia-smi --query-gpu prints them, writes ``printed`` beside itself, then waits to be
    stopped."""
    path = os.path.join(folder, 'nvidia-smi')
    printed = os.path.join(folder, 'printed')
    with open(path, 'w') as file:
        file.write(f'#!{sys.executable}\nimport time\nprint({chr(10).join(LINES)!r}, flush=True)\n'
                   f'open({printed!r}, "w").close()\ntime.sleep(60)\n')
    os.chmod(path, stat.S_IRWXU)
    return path


def wait_for_samples(sampler: GpuSampler, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(sampler.samples) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_busy_samples_of_every_gpu_give_the_median_clock_and_power_and_the_hottest_temperature(tmp_path):
    with GpuSampler(command=fake_nvidia_smi(str(tmp_path))) as sampler:
        wait_for_samples(sampler, 5)
    assert sampler.process.returncode is not None and len(sampler.samples) == 5
    assert sampler.summary() == {'gpu_sm_clock_mhz': 1830.0, 'gpu_power_w': 690.5, 'gpu_temperature_c': 71.0,
                                 'gpu_busy_samples': 3}
    assert format_clocks([{'name': 'ours', **sampler.summary()}, {'name': 'cpu row'}]) == (
        'ours                       SM 1,830 MHz  690 W  max 71 C  (3 samples)')


def test_without_nvidia_smi_a_row_has_no_clock_figures():
    with GpuSampler(command='no-such-nvidia-smi') as sampler:
        pass
    assert (sampler.process, sampler.summary()) == (None, {})


def test_a_torchtitan_row_carries_the_clocks_read_while_it_trained(tmp_path, monkeypatch):
    os.makedirs(tmp_path / 'bin')
    fake_nvidia_smi(str(tmp_path / 'bin'))
    monkeypatch.setenv('PATH', f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    script = tmp_path / 'run.sh'
    script.write_text(f"python3 - \"$1\" <<'EOF'{FAKE_TORCHTITAN}EOF\n"
                      f"until [ -e {tmp_path / 'bin' / 'printed'} ]; do sleep 0.1; done\n")  # nvidia-smi has printed
    monkeypatch.setattr(benchmark, 'TORCHTITAN_SCRIPT', str(script))
    result = benchmark.run_row('unused', Row.parse('tt torchtitan:compile FLAVOR=1B'), 2, 2, 3, str(tmp_path / 'row'),
                               prepare_yaml=None)
    assert (result['gpu_sm_clock_mhz'], result['gpu_busy_samples']) == (1830.0, 3)
