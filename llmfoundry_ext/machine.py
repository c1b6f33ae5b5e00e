"""The machine a run has: its processes (from the launcher's environment, the only place it is read) and its GPU
(from the device, or named on the command line for ``scripts/plan.py``)."""
import contextlib
import dataclasses
import os
from dataclasses import dataclass
from typing import Optional

GIB = 2 ** 30

MIN_NODES_VARIABLE = 'LLMFOUNDRY_EXT_MIN_NODES'  # set by elastic_launch for its workers: torchrun sets none


@dataclass(frozen=True)
class GPU:
    """What the plan needs of a GPU: its memory as torch reports it (``total_memory``), dense bf16 and float8 peak
    FLOP/s (the vendor's, without sparsity; float8 None: it has no float8 tensor cores), memory bandwidth, and the
    share of the speed model's efficiency it reaches (``speed.py``: fitted on the H200 and the H100; other GPUs are
    given the H100's and are not ``calibrated``)."""
    name: str
    memory_bytes: int
    bf16_flops: float
    float8_flops: Optional[float]
    bandwidth: float = 3.35e12
    efficiency: float = 0.967
    calibrated: bool = False

    @property
    def has_float8(self) -> bool:
        return self.float8_flops is not None


# Vendor datasheets; memory as ``torch.cuda.get_device_properties().total_memory`` reports it on the H100 and H200
# (79.2 and 139.8 GiB); an MI250X is two GCDs, each a GPU of 64 GiB to torch.
GPUS = {
    'h100': GPU('NVIDIA H100 80GB HBM3', int(79.19 * GIB), 989e12, 1979e12, 3.35e12, 0.967, calibrated=True),
    'h200': GPU('NVIDIA H200', int(139.80 * GIB), 989e12, 1979e12, 4.8e12, 1.0, calibrated=True),
    'mi250x': GPU('AMD Instinct MI250X (one GCD)', 64 * GIB, 191.5e12, None, 1.6e12),
    'mi300x': GPU('AMD Instinct MI300X', 192 * GIB, 1307e12, 2615e12, 5.3e12),
}


def gpu_named(text: str) -> GPU:
    """``h100``, ``h200``, ``mi250x``, ``mi300x``, or a memory size in GiB (an H100's speed assumed)."""
    key = text.lower()
    if key in GPUS:
        return GPUS[key]
    try:
        gib = float(key)
    except ValueError:
        raise ValueError(f"unknown GPU '{text}': give one of {', '.join(GPUS)} or a memory size in GiB") from None
    h100 = GPUS['h100']
    return GPU(f'a GPU of {gib:g} GiB (H100 speed assumed)', int(gib * GIB), h100.bf16_flops, None, h100.bandwidth)


def gpu_of_this_machine() -> Optional[GPU]:
    """The visible GPU, matched to the table by name (an unknown one: its memory, an H100's speed); None without."""
    import torch
    if not torch.cuda.is_available():
        return None
    properties = torch.cuda.get_device_properties(0)
    for key, known in GPUS.items():
        if key.removesuffix('x') in properties.name.lower().replace(' ', ''):
            return dataclasses.replace(known, name=properties.name, memory_bytes=properties.total_memory)
    h100 = GPUS['h100']
    float8 = h100.float8_flops if torch.cuda.get_device_capability() >= (8, 9) else None
    return GPU(properties.name, properties.total_memory, h100.bf16_flops, float8, h100.bandwidth)


@dataclass(frozen=True)
class Machine:
    """The run's processes and GPU: ``world_size`` processes, ``local_world_size`` a node, this one ``rank``;
    ``job``: the launch's rendezvous (``MASTER_ADDR:MASTER_PORT``), the same on every rank of one job, None when no
    launcher started this process."""
    world_size: int = 1
    local_world_size: int = 1
    rank: int = 0
    node_rank: int = 0
    gpu: Optional[GPU] = None
    job: Optional[str] = None
    restart: int = 0        # torchrun's elastic agent: the restarts it has made (a node joining makes none)
    max_restarts: int = 0   # and how many it may make (0: not elastic, or none allowed)
    min_nodes: int = 1      # the fewest nodes the elastic job goes on with (``elastic_launch``'s --nnodes MIN:MAX)

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)

    @property
    def restarts_left(self) -> int:
        return self.max_restarts - self.restart

    @property
    def elastic(self) -> bool:
        """Started by torchrun's elastic agent with restarts allowed."""
        return self.max_restarts > 0

    @property
    def world(self) -> str:
        """'4 ranks on 2 nodes'."""
        return f"{self.world_size} ranks on {self.nodes} node{'s' if self.nodes > 1 else ''}"

    @classmethod
    def from_environment(cls, gpu: Optional[GPU] = None) -> 'Machine':
        """This process's launch (composer, torchrun, srun), before any process group, and its GPU."""
        world = int(os.environ.get('WORLD_SIZE', '1'))
        job = (f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
               if 'MASTER_PORT' in os.environ and 'WORLD_SIZE' in os.environ else None)
        node_rank = os.environ.get('NODE_RANK', os.environ.get('GROUP_RANK', '0'))  # torchrun: GROUP_RANK
        return cls(world_size=world, local_world_size=int(os.environ.get('LOCAL_WORLD_SIZE', str(world))),
                   rank=int(os.environ.get('RANK', '0')), node_rank=int(node_rank), gpu=gpu, job=job,
                   restart=int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')),
                   max_restarts=int(os.environ.get('TORCHELASTIC_MAX_RESTARTS', '0')),
                   min_nodes=int(os.environ.get(MIN_NODES_VARIABLE, '1')))

    @classmethod
    def described(cls, gpus: int, gpu: GPU, gpus_per_node: int = 8) -> 'Machine':
        """A machine of ``gpus`` GPUs, ``gpus_per_node`` a node (fewer: one node), for planning elsewhere."""
        return cls(world_size=gpus, local_world_size=min(gpus, gpus_per_node), gpu=gpu)


@contextlib.contextmanager
def launched_as(machine: Machine):
    """This process seen as a rank of ``machine``'s launch while the block runs (``scripts/plan.py`` plans for a
    machine it does not run on); the environment is restored after."""
    names = {'WORLD_SIZE': machine.world_size, 'LOCAL_WORLD_SIZE': machine.local_world_size}
    before = {name: os.environ.get(name) for name in names}
    os.environ.update({name: str(value) for name, value in names.items()})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


def name_the_node_rank() -> None:
    """Composer reads a rank's node from NODE_RANK, which its launcher sets; torchrun sets GROUP_RANK (its agent's
    rank, one agent a node) instead, and a job of several nodes stopped at its first collective call that asked. Set
    from it where missing."""
    if 'NODE_RANK' not in os.environ and 'GROUP_RANK' in os.environ:
        os.environ['NODE_RANK'] = os.environ['GROUP_RANK']


def world_size() -> int:
    """World size from the launcher's environment, before any process group."""
    return Machine.from_environment().world_size


def global_rank() -> int:
    """This process's rank from the launcher's environment, before any process group."""
    return Machine.from_environment().rank
