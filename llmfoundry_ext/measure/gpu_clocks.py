"""The GPUs' clocks, power and temperature while a benchmark row trains, read with ``nvidia-smi`` beside it.

Ours and torchtitan run the same GEMM and attention kernels as often, yet each took 2-4 % longer in ours' trace
(docs/performance.md): a GPU kept busier may run at lower clocks under its power limit. Each row says at what clock
and power its GPUs ran while busy, so two rows of one lease can be compared at the clock they had. Settings are only
read, never set. Our own code because Composer's system-metrics callback samples at batch ends inside the run, and
torchtitan's rows run outside Composer.
"""
import shutil
import statistics
import subprocess
import threading

QUERY = 'index,clocks.sm,power.draw,temperature.gpu,utilization.gpu'
BUSY_PERCENT = 90  # samples at this utilization or more are the training's (not compiling, loading or idle)


class GpuSampler:
    """A context: ``nvidia-smi`` prints one line a GPU every ``interval_ms`` while the body runs (nothing where
    there is no ``nvidia-smi``); ``summary()`` after it."""

    def __init__(self, interval_ms: int = 200, command: str = 'nvidia-smi'):
        self.command = [command, f'--query-gpu={QUERY}', '--format=csv,noheader,nounits', f'--loop-ms={interval_ms}']
        self.samples: list[tuple[float, ...]] = []
        self.process = self.reader = None

    def __enter__(self) -> 'GpuSampler':
        if shutil.which(self.command[0]):
            self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.reader = threading.Thread(target=self.read, daemon=True)
            self.reader.start()
        return self

    def read(self) -> None:
        for line in self.process.stdout:
            sample = parse(line)
            if sample is not None:
                self.samples.append(sample)

    def __exit__(self, *exception) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()
            self.reader.join(timeout=5)

    def summary(self) -> dict:
        """Over the busy samples of every GPU: the median SM clock (MHz) and power (W), the hottest temperature (C)
        and how many samples; {} without busy samples."""
        busy = [sample for sample in self.samples if sample[4] >= BUSY_PERCENT]
        if not busy:
            return {}
        return {'gpu_sm_clock_mhz': statistics.median(s[1] for s in busy),
                'gpu_power_w': statistics.median(s[2] for s in busy),
                'gpu_temperature_c': max(s[3] for s in busy), 'gpu_busy_samples': len(busy)}


def parse(line: str) -> tuple[float, ...] | None:
    """'0, 1980, 650.12, 55, 100' -> (index, MHz, W, C, %); None for a line with a value nvidia-smi could not read
    ('[N/A]')."""
    try:
        values = tuple(float(value) for value in line.split(','))
    except ValueError:
        return None
    return values if len(values) == 5 else None


def format_clocks(results: list[dict]) -> str:
    """A line a row that has busy samples: its GPUs' median clock and power, hottest temperature."""
    return '\n'.join(f"{r['name']:<26} SM {r['gpu_sm_clock_mhz']:,.0f} MHz  {r['gpu_power_w']:.0f} W  "
                     f"max {r['gpu_temperature_c']:.0f} C  ({r['gpu_busy_samples']} samples)"
                     for r in results if 'gpu_sm_clock_mhz' in r)
