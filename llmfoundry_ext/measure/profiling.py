"""Profile a few training steps with torch.profiler: a Chrome/Perfetto trace and a table of where the time went.

Kernels (GPU) or operators (CPU) are grouped into categories by name, each with its share of the profiled time.
"""
import collections
import gzip
import json
import re
import statistics
import traceback
import warnings
from dataclasses import dataclass

import torch
from composer.core import Callback, State
from composer.loggers import Logger

CATEGORIES = (  # first match wins; names are lower-cased
    ('memory copies', r'^triton_\w*(all_gather|reduce_scatter|all_reduce)'),  # compiled copy into a collective's buffer
    ('communication', r'nccl|rccl|all_?gather|reduce_?scatter|all_?reduce|broadcast|c10d'),
    ('attention', r'flash|fmha|attention|sdpa|cudnn.*mha|_efficient_attention|_flash_attention'),
    ('loss', r'cross_entropy|log_?softmax|nll_loss|softmax_backward'),
    ('normalization', r'rms_?norm|layer_?norm|rsqrt'),
    ('RoPE', r'rope|rotary'),
    ('grouped GEMM', r'groupproblemshape|grouped_?mm'),  # mixture of experts: every expert in one launch
    ('GEMM', r'gemm|cutlass|xmma|wgmma|nvjet|cublas|aten::(mm|addmm|bmm|matmul|linear)\b'),
    ('optimizer', r'adam|multi_tensor_apply|foreach'),
    # the routing of a mixture of experts (and the embedding's gradient)
    ('sort, index', r'sort|topk|histogram|histc|index_?(add|put|select)|indexfunc|index_elementwise|'
                    r'indexing_backward|scatter|gather|devicescan|cumsum|repeat_interleave|aten::(index|argsort)\b'),
    ('memory copies', r'memcpy|memset|copy_|aten::(to|_to_copy|cat|clone|contiguous)\b|catarray'),
    ('elementwise', r'elementwise|vectorized|unrolled|reduce_kernel|triton|aten::(mul|add|silu|neg|pow|mean|cos|sin|'
                    r'sum|div|where|masked_fill|fill_|zero_)'),
)


def categorize(name: str) -> str:
    lowered = name.lower()
    for category, pattern in CATEGORIES:
        if re.search(pattern, lowered):
            return category
    return 'other'


def self_times(profile: torch.profiler.profile) -> dict[str, float]:
    """name -> self time in ms: GPU kernels where a GPU ran, else CPU operators. Annotated ranges (optimizer
    step, FSDP hooks) span kernels already counted, so they are left out."""
    on_device: dict[str, float] = collections.defaultdict(float)
    on_cpu: dict[str, float] = collections.defaultdict(float)
    for event in profile.events():
        if getattr(event, 'is_user_annotation', False):
            continue
        if event.device_type == torch.autograd.DeviceType.CUDA:
            on_device[event.name] += event.self_device_time_total / 1000
        elif event.name.startswith('aten::'):
            on_cpu[event.name] += event.self_cpu_time_total / 1000
    return dict(on_device or on_cpu)


def category_table(times: dict[str, float], top: int = 3) -> list[dict]:
    """Rows {category, ms, share, top kernels}, largest first; shares sum to 1."""
    total = sum(times.values())
    grouped: dict[str, list[tuple[str, float]]] = {}
    for name, ms in times.items():
        grouped.setdefault(categorize(name), []).append((name, ms))
    rows = [{'category': category, 'ms': sum(ms for _, ms in kernels), 'share': sum(ms for _, ms in kernels) / total,
             'top': [name for name, _ in sorted(kernels, key=lambda kernel: -kernel[1])[:top]]}
            for category, kernels in grouped.items()]
    return sorted(rows, key=lambda row: -row['ms'])


def format_table(rows: list[dict], steps: int) -> str:
    lines = [f"{'category':<15}{'ms/step':>10}{'share':>8}  top kernels"]
    for row in rows:
        names = '; '.join(name[:60] for name in row['top'])
        lines.append(f"{row['category']:<15}{row['ms'] / steps:>10.2f}{row['share']:>8.1%}  {names}")
    return '\n'.join(lines)


GPU_EVENTS = ('kernel', 'gpu_memcpy', 'gpu_memset')  # Chrome-trace categories of work on the GPU


@dataclass
class TraceSummary:
    """What a profiled stretch of training did on one GPU, from its Chrome trace (ours or torchtitan's)."""
    busy_ms: float  # time at least one kernel or copy ran
    span_ms: float  # first GPU event's start to last one's end
    steps: int  # profiled steps (the trace's ProfilerStep#N ranges)
    gaps: list[dict]  # idle stretches, longest first: {ms, after: the kernel that ended, before: the next one,
    #                   launched_in: the CPU ranges, outermost first, around the launch of the next one,
    #                   host_work: what that thread did during the stretch, longest first}
    device_events: list[tuple[str, int, float, float]]  # (name, stream, start us, duration us), by start

    @property
    def kernels(self) -> dict[str, float]:
        """Kernel name -> ms, summed over the profiled steps."""
        totals: dict[str, float] = collections.defaultdict(float)
        for name, _, _, duration in self.device_events:
            totals[name] += duration / 1000
        return dict(totals)


def write_timeline(summary: TraceSummary, path: str) -> None:
    """The trace's GPU work alone, gzipped JSON {names, events: [[name index, stream, start us, duration us]]}: a
    few MB where the whole trace is GBs, to line up ranks' kernels (who waited for whom) away from the GPU."""
    names = sorted({name for name, *_ in summary.device_events})
    index = {name: i for i, name in enumerate(names)}
    events = [[index[name], stream, start, duration] for name, stream, start, duration in summary.device_events]
    with gzip.open(path, 'wt') as file:
        json.dump({'names': names, 'events': events}, file)


def read_timeline(path: str) -> list[tuple[str, int, float, float]]:
    """A ``write_timeline`` file's events: (name, stream, start us, duration us), by start."""
    with gzip.open(path, 'rt') as file:
        timeline = json.load(file)
    return [(timeline['names'][i], stream, start, duration) for i, stream, start, duration in timeline['events']]


def collective_stats(events: list[tuple[str, int, float, float]]) -> list[dict]:
    """Each communication kernel on each stream: {stream, kernel, calls, total_ms, median_ms, max_ms}, most time
    first. A kernel that waits for another rank lasts its transfer plus the wait: where ranks wait for each other
    shows as a long median on one rank and a short one on the other."""
    durations = collections.defaultdict(list)
    for name, stream, _, duration in events:
        if categorize(name) == 'communication':
            durations[stream, name].append(duration / 1000)
    rows = [{'stream': stream, 'kernel': name, 'calls': len(ms), 'total_ms': sum(ms),
             'median_ms': statistics.median(ms), 'max_ms': max(ms)} for (stream, name), ms in durations.items()]
    return sorted(rows, key=lambda row: -row['total_ms'])


def interleave(timelines: dict[str, list], kernel: str, index: int, before_ms: float, after_ms: float,
               shortest_ms: float = 0.3) -> list[tuple[str, int, float, float, str]]:
    """The ranks' GPU work side by side, on their common clock (the ranks of one host share it), in the window
    around the ``index``-th ``kernel`` of the first timeline: (name of the timeline, stream, start ms from the first
    event of all, duration ms, kernel), by start; events shorter than ``shortest_ms`` left out."""
    first = next(iter(timelines.values()))
    at = [start for name, _, start, _ in first if kernel in name][index]
    origin = min(events[0][2] for events in timelines.values())
    rows = [(label, stream, (start - origin) / 1000, duration / 1000, name)
            for label, events in timelines.items() for name, stream, start, duration in events
            if at - before_ms * 1000 <= start <= at + after_ms * 1000 and duration >= shortest_ms * 1000]
    return sorted(rows, key=lambda row: row[2])


def read_trace(path: str) -> TraceSummary:
    """Kernel times, busy time and span of a torch.profiler Chrome trace; its steps are its ProfilerStep#N ranges."""
    with open(path) as file:
        events = [e for e in json.load(file)['traceEvents'] if e.get('ph') == 'X']
    gpu = sorted((e for e in events if e.get('cat') in GPU_EVENTS), key=lambda e: e['ts'])
    busy, covered_to, last, gaps = 0.0, float('-inf'), None, []
    for event in gpu:
        start, end = event['ts'], event['ts'] + event['dur']
        busy += max(0.0, end - max(start, covered_to))
        if last is not None and start > covered_to:
            gaps.append(({'ms': (start - covered_to) / 1000, 'after': last, 'before': event['name']}, event,
                         covered_to))
        if end >= covered_to:
            covered_to, last = end, event['name']
    steps = {e['name'] for e in events if e['name'].startswith('ProfilerStep#')}
    span = (covered_to - gpu[0]['ts']) / 1000 if gpu else 0.0
    gaps.sort(key=lambda gap: -gap[0]['ms'])
    launches = {e['args']['correlation']: e for e in events
                if e.get('cat') in LAUNCH_EVENTS and 'correlation' in e.get('args', {})}
    for gap, kernel, idle_from in gaps[:GAPS_TRACED]:
        launch = launches.get(kernel.get('args', {}).get('correlation'))
        gap['launched_in'] = launch_context(events, launch)
        gap['host_work'] = host_work(events, launch, idle_from, kernel['ts'])
    device_events = [(e['name'], e.get('args', {}).get('stream', e.get('tid')), e['ts'], e['dur']) for e in gpu]
    return TraceSummary(busy / 1000, span, len(steps), [gap for gap, *_ in gaps], device_events)


LAUNCH_EVENTS = ('cuda_runtime', 'cuda_driver')  # the CPU-side calls that launch GPU work
GAPS_TRACED = 20  # the longest idle stretches whose launch context is looked up (a scan of the trace each)


def launch_context(events: list[dict], launch: dict | None) -> str:
    """The CPU ranges (operators, annotations) around a launch on its thread, outermost first: the code whose
    work ended an idle stretch. Empty without the launch (a copy or a trace without CPU events)."""
    if launch is None:
        return ''
    around = [e for e in events if e.get('cat') in ('cpu_op', 'user_annotation') and e.get('tid') == launch.get('tid')
              and e['ts'] <= launch['ts'] <= e['ts'] + e['dur'] and not e['name'].startswith('ProfilerStep#')]
    return ' > '.join(e['name'] for e in sorted(around, key=lambda e: (e['ts'], -e['dur'])))


def host_work(events: list[dict], launch: dict | None, start: float, end: float, shown: int = 4) -> str:
    """What the launching thread did while the GPU sat idle in [start, end]: the innermost of its ranges that
    spans the whole stretch (``all of it in aten::_chunk_cat``: host work inside one operator), then its
    operators, annotations and CUDA calls that began or ended inside the stretch and overlapped it by over 0.1 ms,
    the longest overlap first."""
    if launch is None:
        return ''
    thread = [e for e in events if e.get('cat') in HOST_EVENTS and e.get('tid') == launch.get('tid')
              and e['ts'] < end and e['ts'] + e['dur'] > start]
    around, inside = [], []
    for e in thread:
        (around if e['ts'] <= start and e['ts'] + e['dur'] >= end else inside).append(e)
    parts = [f"all of it in {max(around, key=lambda e: (e['ts'], -e['dur']))['name']}"] if around else []
    overlaps = [(min(end, e['ts'] + e['dur']) - max(start, e['ts']), e['name']) for e in inside]
    longest = sorted((o for o in overlaps if o[0] > 100), reverse=True)[:shown]
    return ', '.join(parts + [f'{name} {overlap / 1000:.2f} ms' for overlap, name in longest])


HOST_EVENTS = ('cpu_op', 'user_annotation', 'python_function', *LAUNCH_EVENTS)


def compare_traces(summaries: dict[str, TraceSummary]) -> list[dict]:
    """Rows {category, <name>: ms per step, ...} for each trace, largest first in the first; then GPU busy,
    GPU idle and span per step."""
    per_step = {name: {row['category']: row['ms'] / s.steps for row in category_table(s.kernels)}
                for name, s in summaries.items()}
    first = next(iter(per_step.values()))
    categories = sorted({c for table in per_step.values() for c in table}, key=lambda c: -first.get(c, 0.0))
    rows = [{'category': c, **{name: table.get(c, 0.0) for name, table in per_step.items()}} for c in categories]
    for label, value in (('GPU busy', lambda s: s.busy_ms), ('GPU idle', lambda s: s.span_ms - s.busy_ms),
                         ('span', lambda s: s.span_ms)):
        rows.append({'category': label, **{name: value(s) / s.steps for name, s in summaries.items()}})
    return rows


def top_kernels(summary: TraceSummary, count: int) -> list[dict]:
    """The ``count`` kernels with the most time per step: {kernel, category, ms, calls} (calls per step)."""
    ranked = sorted(summary.kernels.items(), key=lambda kernel: -kernel[1])[:count]
    calls = collections.Counter(name for name, *_ in summary.device_events)
    return [{'kernel': name, 'category': categorize(name), 'ms': ms / summary.steps,
             'calls': calls[name] / summary.steps} for name, ms in ranked]


def format_comparison(rows: list[dict]) -> str:
    names = [key for key in rows[0] if key != 'category']
    lines = [f"{'ms per step':<15}" + ''.join(f'{name:>14}' for name in names)
             + (f"{'difference':>12}" if len(names) == 2 else '')]
    for row in rows:
        values = [row[name] for name in names]
        lines.append(f"{row['category']:<15}" + ''.join(f'{v:>14.2f}' for v in values)
                     + (f'{values[0] - values[1]:>+12.2f}' if len(names) == 2 else ''))
    return '\n'.join(lines)


ALLOCATOR_COUNTS = ('num_device_alloc', 'num_device_free', 'num_alloc_retries')  # torch.cuda.memory_stats keys


class ProfileSteps(Callback):
    """Profiles batches ``warmup + 1`` .. ``warmup + steps`` of this invocation, each a ``ProfilerStep#N`` range as
    torch.profiler's schedule marks them, then stops training; ``python`` also records Python frames (slower).
    ``allocator``: how many cudaMalloc, cudaFree and out-of-memory retries the caching allocator made in those
    steps (each cudaFree waits for the whole GPU)."""

    def __init__(self, warmup: int, steps: int, python: bool = False):
        self.warmup, self.steps, self.seen, self.step_range = warmup, steps, 0, None
        self.allocator: dict[str, int] = {}
        self.allocator_before: dict[str, int] = {}
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profile = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=python)

    def batch_start(self, state: State, logger: Logger) -> None:
        if self.seen == self.warmup:
            self.allocator_before = allocator_counts()
            self.profile.start()
        if self.seen >= self.warmup:
            self.step_range = torch.profiler.record_function(f'ProfilerStep#{self.seen}')
            self.step_range.__enter__()

    def batch_end(self, state: State, logger: Logger) -> None:
        if self.step_range is not None:
            self.step_range.__exit__(None, None, None)
            self.step_range = None
        self.seen += 1
        if self.seen == self.warmup + self.steps:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.profile.stop()
            self.allocator = {key: count - self.allocator_before[key] for key, count in allocator_counts().items()}
            state.stop_training()


def allocator_counts() -> dict[str, int]:
    """The caching allocator's cumulative cudaMalloc / cudaFree / retry counts; empty without a GPU."""
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {key: stats.get(key, 0) for key in ALLOCATOR_COUNTS}


def reserved_by_stream() -> list[tuple[int, int, int]]:
    """The caching allocator's segments now, summed by the stream they serve: (stream, bytes reserved, bytes
    allocated), the largest reserve first (stream 0: the default). A block freed on one stream serves that stream's
    allocations alone, so what side streams cache stays reserved beside the default stream's peak (FSDP2
    reduce-scatters on its own stream: a sharded run's fp32 gradients sit in that pool). Empty without a GPU."""
    if not torch.cuda.is_available():
        return []
    pools = collections.defaultdict(lambda: [0, 0])
    for segment in torch.cuda.memory._snapshot()['segments']:
        pools[segment['stream']][0] += segment['total_size']
        pools[segment['stream']][1] += segment['allocated_size']
    return sorted(((stream, reserved, allocated) for stream, (reserved, allocated) in pools.items()),
                  key=lambda pool: -pool[1])


class SyncReport(Callback):
    """Lists where batch ``batch`` (counted from 0 in this invocation) made the host wait for the GPU, from its
    start to the next batch's: its step, the callbacks and saver after it and the next batch's fetch. Each
    synchronizing CUDA call (``.item()``, ``torch.equal``, a blocking copy; torch's sync debug mode) with the last
    frames of its Python stack, and how often it ran. A sync leaves the GPU idle while the host then launches the
    next work, so a step without any keeps the GPU fed."""

    FRAMES = 4  # innermost Python frames kept per call site

    def __init__(self, batch: int):
        self.batch, self.seen, self.sites, self.caught = batch, 0, collections.Counter(), None

    def batch_start(self, state: State, logger: Logger) -> None:
        self.stop_listening()
        if self.seen == self.batch and torch.cuda.is_available():
            self.caught = warnings.catch_warnings()
            self.caught.__enter__()
            warnings.simplefilter('always')
            warnings.showwarning = self.record
            torch.cuda.set_sync_debug_mode('warn')
        self.seen += 1

    def record(self, message, category, filename, lineno, file=None, line=None) -> None:
        stack = [f for f in traceback.extract_stack()[:-1] if not f.filename.endswith('warnings.py')]
        if 'synchronizing' in str(message) and stack[-1].name != 'set_sync_debug_mode':  # not turning it on
            frames = reversed(stack[-self.FRAMES:])
            self.sites[' < '.join(f'{f.name} ({f.filename.rsplit("/", 1)[-1]}:{f.lineno})' for f in frames)] += 1

    def fit_end(self, state: State, logger: Logger) -> None:
        self.stop_listening()

    def stop_listening(self) -> None:
        if self.caught is not None:
            torch.cuda.set_sync_debug_mode(0)
            self.caught.__exit__(None, None, None)
            self.caught = None

    def report(self) -> str:
        lines = [f'host syncs in batch {self.batch}: {sum(self.sites.values())}']
        lines += [f'{count:>4}x  {site}' for site, count in self.sites.most_common()]
        return '\n'.join(lines)
